"""``scheduler_cls`` for vLLM: offer each step to the core, inject its samples (sync and async schedulers).

How a step is formed (the crux, see docs/vllm-adapter.md §"Injection"):

1. ``super().schedule()`` forms the step exactly as vLLM would (admission, preemption, budgets, KV blocks).
2. That :class:`SchedulerOutput` is translated into a :class:`ProposedBatch` and offered to the interceptor.
3. Returned samples become internal :class:`Request` objects on the reserved LoRA and are *appended* to that
   same SchedulerOutput: KV slots from ``kv_cache_manager.allocate_slots``, a ``NewRequestData`` row, their
   token counts, and the post-schedule bookkeeping vLLM applies to any newly scheduled request. All-or-nothing:
   if the token budget, the request slots, the LoRA slots or the KV cache cannot take every sample, none is
   added and the step's record lists them as aborted (the core returns them to its pool).
4. In ``update_from_output`` the injected requests are finished (``finish_requests``) *before* vLLM processes
   the step's output, so vLLM skips them: no sampled token, no EngineCoreOutput, nothing reaches a client.
   Then the step's :class:`StepRecord` is built from the plan and the worker's timing and sent to the sink.

Appending to the proposed output (rather than re-running ``schedule()`` a second time on a queue of only the
fine-tuning requests) keeps vLLM's own pass untouched and runs it once per step, so its side effects
(step counters, prefix-cache stats, connector metadata, finished-id hand-off) happen exactly once.

Async scheduling (:class:`AsyncDeltaServeScheduler`, vLLM's ``AsyncScheduler``): the engine schedules step N+1
before it processes step N's output, so an injected row is still unretired while the next step is formed. Three
rules make that safe, and both schedulers share them (:class:`DeltaServeSchedulerMixin`):

- an injected row is registered in ``requests`` but never enters ``running`` (nor ``waiting``): vLLM's
  ``schedule()`` only walks those queues, so the row can be neither scheduled again (a decode with output
  placeholders) nor preempted and re-queued; its KV blocks stay allocated until ``update_from_output`` of its own
  step finishes it, which also puts its id in ``finished_req_ids`` for the worker. It gets no output placeholder:
  ``AsyncScheduler._update_after_schedule`` runs inside ``super().schedule()``, before the row exists.
- a step carrying fine-tuning rows is processed before the next step is formed: while one is in flight
  ``has_requests()`` answers False, and vLLM's batch-queue loop, finding nothing to schedule, blocks on its oldest
  step instead. The core decides from the records of earlier steps (a record can start a backward and a new
  adapter); forming the next step first would either ask it before it has seen that record (it could admit rows
  forwarded with weights it is about to replace) or skip asking it, and the hook contract wants it asked once per
  step. Inference-only steps still overlap as vLLM intends; only the step after a fine-tuning step loses its
  overlap. With the synchronous scheduler nothing is ever in flight when the engine asks.
- an empty step formed while a client step is in flight is not offered (a core would fill it with rows, whose
  forward runs before that client step's output is handed back, delaying the client's token by a whole step).
"""
from __future__ import annotations

import dataclasses
import inspect
import itertools
import time
from typing import TYPE_CHECKING, Any

from vllm.sampling_params import SamplingParams
from vllm.v1.core.sched.async_scheduler import AsyncScheduler
from vllm.v1.core.sched.output import NewRequestData, SchedulerOutput
from vllm.v1.core.sched.scheduler import Scheduler
from vllm.v1.request import Request, RequestStatus

from deltaserve_core.hostkit import TokenClock
from deltaserve_core.types import (
    FineTuneSample,
    ProposedBatch,
    RequestSLO,
    ScheduledRequest,
)

from .channel import CONFIG_KEY, FINETUNE_REQUEST_PREFIX, StepPlan, get_channel
from .graphs import predict_mode
from .worker import DeferredStepTiming

__all__ = ["EXTRA_ARGS_KEY", "FINETUNE_REQUEST_PREFIX", "AsyncDeltaServeScheduler", "DeltaServeScheduler",
           "DeltaServeSchedulerMixin", "scheduler_cls_name"]

#: vLLM request ids of injected fine-tuning rows start with this (never a client id: clients go through
#: LLMEngine.add_request, which appends a random suffix to whatever id they pass, and the driver refuses it).
_FROM_REQUEST_TAKES_MROPE = "uses_mrope" in inspect.signature(NewRequestData.from_request).parameters
#: ``SamplingParams.extra_args`` key under which the driver passes the client id and SLO to the scheduler
#: (extra_args is a public field that travels with the request into the EngineCore process).
EXTRA_ARGS_KEY = "deltaserve"

if TYPE_CHECKING:
    _SchedulerBase = Scheduler
else:
    _SchedulerBase = object


def scheduler_cls_name(async_scheduling: bool) -> str:
    """The ``scheduler_cls`` qualname matching vLLM's ``async_scheduling`` (as vLLM pairs its own schedulers)."""
    cls = AsyncDeltaServeScheduler if async_scheduling else DeltaServeScheduler
    return f"{cls.__module__}.{cls.__qualname__}"


class DeltaServeSchedulerMixin(_SchedulerBase):
    """The DeltaServe step interception over either vLLM scheduler. See the module docstring.

    Put before the vLLM class in the bases; ``_ds_async`` says which engine loop the class is meant for.
    """

    _ds_async: bool = False

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        extra = self.vllm_config.additional_config
        key = extra.get(CONFIG_KEY) if isinstance(extra, dict) else None
        self._ds = get_channel(key)
        self._ds.scheduler_attached = True
        self._ds_step_ids = itertools.count()
        # (first token time, last token time, tokens seen) per client request, in this process's monotonic clock.
        self._ds_token_times = TokenClock()
        self._ds_params = SamplingParams(max_tokens=1, temperature=0.0, skip_reading_prefix_cache=True,
                                         detokenize=False)
        self._ds_block_hasher = self._make_block_hasher(kwargs.get("hash_block_size") or self.hash_block_size)
        # Injected rows not yet retired (vLLM request id -> request): outside running/waiting, see the docstring.
        self._ds_in_flight: dict[str, Request] = {}
        # Both vLLM model runners are followed by the worker extension (runner_view). For the V2 runner an injected
        # request carries its token ids as ``prefill_token_ids`` (_new_request_data), as vLLM's own requests do.
        if self.connector is not None or self.num_spec_tokens:
            raise RuntimeError("deltaserve_vllm does not support KV connectors or speculative decoding yet")
        if self.lora_config is None:
            raise RuntimeError("deltaserve_vllm needs enable_lora=True: fine-tuning rows run on a reserved LoRA")
        # The reserved fine-tuning adapter is pinned in one of the worker's max_loras slots, so a step can hold at
        # most max_loras - 1 client adapters. vLLM's scheduler caps a step at max_loras adapters: left as it is, a
        # step with one adapter too many reaches the worker, whose LoRA mapping then names an adapter no slot holds,
        # and the step fails with every client row in it. vLLM's cap is given the slots the clients really have;
        # the injection path counts the reserved adapter against the true slot count.
        self._ds_lora_slots = self.lora_config.max_loras
        if self._ds_lora_slots < 2:
            raise RuntimeError(f"max_loras={self._ds_lora_slots}: DeltaServe pins one LoRA slot to the fine-tuning "
                               "adapter, so clients need at least one more; set max_loras to 2 or more")
        self.lora_config = dataclasses.replace(self.lora_config, max_loras=self._ds_lora_slots - 1)
        if getattr(self.scheduler_config, "async_scheduling", False) and not self._ds_async:
            # Under async scheduling a plain Scheduler re-schedules nothing still in flight, so vLLM would run,
            # but without overlap (vLLM warns); the matching subclass is the async one.
            raise RuntimeError(f"vLLM runs with async_scheduling=True: use scheduler_cls="
                               f"{scheduler_cls_name(True)!r} (VllmHost picks it itself)")
        self._ds.scheduler_ready(self)

    def _make_block_hasher(self, hash_block_size: int):
        # Internal requests must carry the engine's block hasher when prefix caching is on (vLLM caches their
        # full blocks on allocation; a request without hashes crashes block_pool.cache_full_blocks).
        if not self.cache_config.enable_prefix_caching:
            return None
        from vllm.utils.hashing import get_hash_fn_by_name
        from vllm.v1.core.kv_cache_utils import get_request_block_hasher

        return get_request_block_hasher(hash_block_size,
                                        get_hash_fn_by_name(self.cache_config.prefix_caching_hash_algo))

    # ------------------------------------------------------------------------------------ vLLM overrides

    def has_requests(self) -> bool:
        if self._ds_in_flight:
            # Two steps in flight: the step with fine-tuning rows must be processed before the next is formed
            # (module docstring). EngineCore.step_with_batch_queue then blocks on its oldest step rather than
            # scheduling; the busy loop of `vllm serve` still steps, its batch queue not being empty.
            return False
        # EngineCore.step()/step_with_batch_queue() do not schedule when vLLM has no request: an idle step and a
        # pending profile step (a fine-tuning-only shape has no vLLM request at all) need one schedule() anyway.
        ch = self._ds
        return super().has_requests() or ch.wants_idle_step() or (ch.profiling and ch.profile_samples is not None)

    def schedule(self, *args: Any, **kwargs: Any) -> SchedulerOutput:
        out = super().schedule(*args, **kwargs)
        ch = self._ds
        if not out.num_scheduled_tokens and not ch.profiling and self._client_step_in_flight():
            # vLLM formed an empty step behind a client step still in flight (typically the step after a request's
            # last token). Offered, it is an idle step to the core, which fills it with fine-tuning rows; those
            # run their forward before the engine hands back the step in flight, so the client's token would wait
            # for the whole fine-tuning step (seen on the H200 as 300 ms gaps before last tokens). Not offered and
            # not counted as a step, it lets the engine deliver that output first; the next empty step is offered.
            ch.last_step_executed = False
            return out
        ch.idle_requested = False
        step_id = next(self._ds_step_ids)
        batch = self._proposed_batch(step_id, out)
        samples: tuple[FineTuneSample, ...] = ()
        synthetic, reported = False, True
        if ch.profiling:
            # Calibration: the interceptor is not consulted; only the profiled step itself is reported.
            synthetic = reported = ch.profile_samples is not None
            samples, ch.profile_samples = ch.profile_samples or (), None
        elif ch.interceptor is not None:
            samples = tuple(ch.interceptor.on_schedule(batch))
        if self._ds_in_flight:
            # Only reachable if an engine loop schedules without asking has_requests() first (vLLM 0.26 and 0.32
            # never do): the core was asked before seeing the record of a step with rows, so its samples are
            # handed back (refused) rather than forwarded with an adapter it may be about to replace.
            placed, refused = {}, samples
        else:
            placed, refused = self._inject(step_id, out, samples)
        ch.last_step_executed = out.total_num_scheduled_tokens > 0
        ch.plans[id(out)] = StepPlan(
            step_id=step_id, samples=placed, ft_only=bool(placed) and not batch.scheduled, synthetic=synthetic,
            prefill_lengths=batch.prefill_lengths, num_decode=batch.num_decode, kv_tokens=batch.kv_tokens,
            refused=tuple(s.sample_id for s in refused), reported=reported)
        return out

    def update_from_output(self, scheduler_output: SchedulerOutput, model_runner_output: Any) -> Any:
        ch = self._ds
        plan = ch.plans.pop(id(scheduler_output), None)
        timing = ch.timings.pop(id(scheduler_output), None)
        aborted = timing is not None and timing.aborted
        if plan is not None and plan.samples:
            # Retire the fine-tuning rows before vLLM looks at the output: it skips requests it no longer
            # knows, so they produce no token and no client output, and their KV blocks are freed now.
            status = RequestStatus.FINISHED_ABORTED if aborted else RequestStatus.FINISHED_LENGTH_CAPPED
            self.finish_requests(list(plan.samples), status)
            for rid in plan.samples:
                self._ds_in_flight.pop(rid, None)
        outputs = super().update_from_output(scheduler_output, model_runner_output)
        self._track_token_times(scheduler_output)
        if plan is not None:
            self._report(plan, timing, scheduler_output)
        return outputs

    def _client_step_in_flight(self) -> bool:
        # A plan lives from schedule() to update_from_output() of its step: plans left are steps in flight.
        return any(p.prefill_lengths or p.num_decode for p in self._ds.plans.values())

    # ------------------------------------------------------------------------------------ translation

    def _slo_and_id(self, request: Request) -> tuple[str, RequestSLO | None]:
        extra = request.sampling_params.extra_args if request.sampling_params is not None else None
        info = (extra or {}).get(EXTRA_ARGS_KEY) or {}
        slo = info.get("slo")
        return info.get("id", request.request_id), (RequestSLO(*slo) if slo else None)

    def _view(self, request: Request, scheduled_tokens: int, now_mono: float, now_wall: float) -> ScheduledRequest:
        # After super().schedule(), num_computed_tokens already includes this step's tokens.
        before = request.num_computed_tokens - scheduled_tokens
        if scheduled_tokens == 0:
            before = request.num_computed_tokens
        decode = scheduled_tokens > 0 and before >= request.num_prompt_tokens and scheduled_tokens == 1
        client_id, slo = self._slo_and_id(request)
        first, last = self._ds_token_times.times(request.request_id)
        pending = request.num_tokens - before if scheduled_tokens == 0 else scheduled_tokens
        return ScheduledRequest(
            request_id=client_id,
            # vLLM stamps arrival with time.time(); the protocol speaks this process's monotonic clock.
            arrival_time=now_mono - (now_wall - request.arrival_time),
            prefill_tokens=0 if decode or (scheduled_tokens == 0 and request.num_output_tokens) else pending,
            context_tokens=before, output_tokens=request.num_output_tokens, first_token_time=first,
            last_token_time=last, slo=slo)

    def _proposed_batch(self, step_id: int, out: SchedulerOutput) -> ProposedBatch:
        now_mono, now_wall = time.monotonic(), time.time()
        scheduled = tuple(self._view(self.requests[rid], n, now_mono, now_wall)
                          for rid, n in out.num_scheduled_tokens.items() if rid in self.requests)
        waiting = [self._view(r, 0, now_mono, now_wall) for r in self.waiting]
        waiting += [self._view(r, 0, now_mono, now_wall) for r in self.running
                    if r.request_id not in out.num_scheduled_tokens]
        # The mode vLLM will run this batch in as proposed (before any fine-tuning row is appended).
        return ProposedBatch(step_id=step_id, now=now_mono, scheduled=scheduled, waiting=tuple(waiting),
                             mode=predict_mode(scheduled, self._ds.graph_sizes))

    # ------------------------------------------------------------------------------------ injection

    def _inject(self, step_id: int, out: SchedulerOutput,
                samples: tuple[FineTuneSample, ...]) -> tuple[dict[str, FineTuneSample], tuple[FineTuneSample, ...]]:
        """Append ``samples`` to ``out`` as prefill-only requests; all or nothing. Returns (placed, refused)."""
        if not samples:
            return {}, ()
        lora = self._ds.finetune_lora
        if lora is None:
            raise RuntimeError("fine-tuning samples were injected before set_finetune_adapter() loaded the reserved "
                               "adapter; the core must call set_finetune_adapter first")
        tokens = sum(s.num_tokens for s in samples)
        loras = {self.requests[r].lora_request.lora_int_id for r in out.num_scheduled_tokens
                 if r in self.requests and self.requests[r].lora_request is not None}
        loras.add(lora.lora_int_id)  # type: ignore[attr-defined]
        # No row is in flight here (schedule() refuses first), so the bound is the synchronous path's.
        # A sample of max_model_len tokens or more does not fit: the worker's per-request token buffers hold
        # max_model_len, and the runner books the token it samples after every finished prefill (FT rows too) against
        # that length. vLLM refuses such prompts at add_request; an injected one would fail the whole engine step
        # (clients' rows with it), so it is refused here like any sample the step cannot take.
        if (tokens > self.max_num_scheduled_tokens - out.total_num_scheduled_tokens
                or len(self.running) + len(samples) > self.max_num_running_reqs
                or len(loras) > self._ds_lora_slots
                or max(s.num_tokens for s in samples) >= self.max_model_len):
            return {}, samples
        requests: list[tuple[Request, FineTuneSample, Any]] = []
        for s in samples:
            request = Request(request_id=f"{FINETUNE_REQUEST_PREFIX}{step_id}-{s.sample_id}",
                              prompt_token_ids=list(s.input_ids), sampling_params=self._ds_params,
                              pooling_params=None, lora_request=lora,  # type: ignore[arg-type]
                              block_hasher=self._ds_block_hasher)
            blocks = self.kv_cache_manager.allocate_slots(request, s.num_tokens)
            if blocks is None:  # KV cache full: give back what this step allocated, inject nothing
                for r, _, _ in requests:
                    self.kv_cache_manager.free(r)
                self.kv_cache_manager.free(request)
                return {}, samples
            requests.append((request, s, blocks))
        placed: dict[str, FineTuneSample] = {}
        for request, s, blocks in requests:
            rid = request.request_id
            self.requests[rid] = request
            # RUNNING so finish_requests treats it as a running request (remove_all tolerates its absence from
            # self.running); kept out of self.running so no later schedule() can pick or preempt it.
            request.status = RequestStatus.RUNNING
            self._ds_in_flight[rid] = request
            # Built before advancing num_computed_tokens: the worker reads it as "computed before this step".
            out.scheduled_new_reqs.append(self._new_request_data(request, blocks.get_block_ids()))
            out.num_scheduled_tokens[rid] = s.num_tokens
            out.total_num_scheduled_tokens += s.num_tokens
            # The bookkeeping _update_after_schedule applies to every request vLLM schedules.
            request.num_computed_tokens = s.num_tokens
            request.num_in_flight_tokens += s.num_tokens
            request.is_prefill_chunk = False
            if not self.use_v2_model_runner:
                # V1 only: vLLM keeps this set for the V1 runner (and leaves it alone under V2, never clearing it)
                self.prev_step_scheduled_req_ids.add(rid)
            placed[rid] = s
        if self.needs_kv_cache_zeroing:
            fresh = self.kv_cache_manager.take_new_block_ids()
            if fresh:
                out.new_block_ids_to_zero = (out.new_block_ids_to_zero or []) + fresh
        return placed, ()

    def _new_request_data(self, request: Request, block_ids: Any) -> NewRequestData:
        kwargs: dict[str, Any] = {}
        if self.use_v2_model_runner:
            # The V2 runner builds its request state from prefill_token_ids (its add_requests asserts it is set);
            # vLLM's scheduler passes every new request's token ids there when the V2 runner is in use.
            kwargs["prefill_token_ids"] = list(request.all_token_ids)
        # vLLM 0.32 added ``uses_mrope`` to from_request; 0.26 (CUDA) has no such parameter.
        if _FROM_REQUEST_TAKES_MROPE:
            kwargs["uses_mrope"] = self.model_uses_mrope
        return NewRequestData.from_request(request, block_ids, **kwargs)

    # ------------------------------------------------------------------------------------ reporting

    def _track_token_times(self, out: SchedulerOutput) -> None:
        now = time.monotonic()
        for rid in out.num_scheduled_tokens:
            request = self.requests.get(rid)
            if request is None or request.is_finished():
                self._ds_token_times.forget(rid)
            else:
                self._ds_token_times.observe(rid, request.num_output_tokens, now)

    def _report(self, plan: StepPlan, timing: Any, out: SchedulerOutput) -> None:
        ch = self._ds
        if not plan.reported or (out.total_num_scheduled_tokens == 0 and not plan.refused):
            return  # a profile warm-up step, or nothing ran
        aborted = timing is not None and timing.aborted
        if isinstance(timing, DeferredStepTiming):
            timing = timing.resolve()
        if timing is None:
            record = plan.to_record(start=time.monotonic(), duration=0.0)
        else:
            record = plan.to_record(start=timing.start, duration=timing.duration, mode=timing.mode, aborted=aborted)
        if plan.synthetic:
            ch.profile_record = record
        if ch.step_sink is not None:
            ch.step_sink(record)


class DeltaServeScheduler(DeltaServeSchedulerMixin, Scheduler):
    """vLLM's synchronous :class:`Scheduler` plus the DeltaServe step interception."""

    _ds_async = False


class AsyncDeltaServeScheduler(DeltaServeSchedulerMixin, AsyncScheduler):
    """vLLM's :class:`AsyncScheduler` (``async_scheduling=True``) plus the DeltaServe step interception.

    Nothing beyond the shared mixin is overridden: output placeholders are added inside ``super().schedule()`` to
    the requests vLLM scheduled, before any row is injected; injected rows are retired before
    ``_update_request_with_output`` could see them; and the mixin's ``has_requests()`` keeps a step with rows from
    overlapping the next one (see the module docstring). Under the synchronous loop those rules are no-ops.
    """

    _ds_async = True
