"""What the plugin hooks do, per SGLang ``Scheduler`` instance that DeltaServe is attached to.

The hooks (installed once per process by :mod:`.plugin` through SGLang's ``HookRegistry``) look for a
:class:`Binding` on the scheduler (``scheduler._deltaserve``) and pass straight through when there is none, so a
scheduler without DeltaServe runs exactly as SGLang ships it. One step, seen from the hooks:

1. ``get_next_batch_to_run`` (AROUND): SGLang forms its batch; it is translated into a ``ProposedBatch`` and
   offered to the interceptor once. Returned samples become native requests (``max_new_tokens=0``, the reserved
   LoRA, a unique radix-cache ``extra_key``); SGLang's own prefill admission forms a batch of only them, counting
   the step's rows as running, and the step's rows are appended behind them (see :meth:`Binding._join`), so
   they run in that very step, whatever it holds (nothing, prefill, decode, or SGLang's mixed chunk). Samples
   SGLang cannot admit (token budget, request or LoRA slots, KV room) are reported aborted in that step's record.
2. ``run_batch`` (AROUND): ``begin_step``, capture on, the forward, device-complete timing, ``end_step``; the
   mode the step ran in is SGLang's own answer (``GenerationBatchResult.can_run_cuda_graph``). On CUDA a step with
   fine-tuning rows never replays a CUDA graph: the graph runners' ``can_run_graph`` answers no for it
   (:func:`deltaserve_sglang.plugin.install_graph_guard`), so the capture hooks run.
3. decoder layers: a forward pre-hook passes a ``capture_output`` callback, SGLang's own auxiliary-hidden-state
   path (EAGLE3), which receives the true residual-stream input of the layer; fine-tuning rows are sliced out.
4. ``SchedulerOutputStreamer.stream_output`` (AROUND): fine-tuning rows are removed before anything is streamed.
5. ``process_batch_result`` (AROUND): after SGLang processed the step's outputs, one ``StepRecord`` goes to the
   step sink.

Two shapes of SGLang's internals are supported (:mod:`.versions`): 0.5.23's, where ``get_next_batch_to_run`` takes
and returns the running batch (a plan object) and ``_get_new_batch_prefill_raw`` takes it as an argument, and
0.5.15's (``legacy``), where both read and write ``scheduler.running_batch`` and ``get_next_batch_to_run`` returns
the batch alone.
"""

from __future__ import annotations

import dataclasses
import itertools
import time
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

from deltaserve_core import hostkit
from deltaserve_core.types import (
    ExecutionMode,
    FineTuneSample,
    ProposedBatch,
    RequestSLO,
    ScheduledRequest,
    StepRecord,
)

__all__ = ["FINETUNE_RID_PREFIX", "PROFILE_RID_PREFIX", "Binding", "StepPlan", "get_binding"]

#: SGLang request ids of injected fine-tuning rows start with this; the driver refuses client ids that do.
FINETUNE_RID_PREFIX = "__deltaserve_ft__"
#: ... and those of calibration's throw-away requests (never streamed either: under a server no client asked).
PROFILE_RID_PREFIX = "__deltaserve_profile__"


@dataclass
class StepPlan(hostkit.StepPlan):
    #: the step a profile run measures (its record is the profile record); the run's other steps are synthetic too
    profiled: bool = False
    #: the forward stopped at a layer boundary because the sink asked (fine-tuning-only steps only)
    aborted: bool = False
    #: how the step ran: SGLang's own answer once it ran (a CUDA-graph replay or eager)
    mode: ExecutionMode = ExecutionMode.EAGER

    @property
    def ft_only(self) -> bool:
        return bool(self.samples) and not self.prefill_lengths and not self.num_decode


@dataclass
class Binding(hostkit.HookSlots):
    """DeltaServe's state on one SGLang scheduler. Set by the host; read by the hooks."""

    #: lora_id (SGLang's LoRA registry key) of the reserved fine-tuning adapter.
    finetune_lora_id: str | None = None
    #: client rid -> (arrival time, SLO), filled by the driver so the proposed batch carries them.
    arrivals: dict[str, tuple[float, RequestSLO | None]] = field(default_factory=dict)
    token_times: hostkit.TokenClock = field(default_factory=hostkit.TokenClock)
    #: called with the client requests SGLang streams in a step (the driver collects outputs from them).
    on_stream: Callable[[Sequence[Any]], None] | None = None
    profile_record: StepRecord | None = None
    idle_requested: bool = False
    last_step_executed: bool = False
    plan: StepPlan | None = None
    num_layers: int = 0
    step_ids: Any = field(default_factory=itertools.count)
    #: SGLang 0.5.15's internals (running batch on the scheduler; see the module docstring)
    legacy: bool = False
    #: the mode a step of this proposed shape runs in without fine-tuning rows (the host's graph_mode)
    graph_mode: Callable[[ProposedBatch], ExecutionMode] | None = None
    #: SGLang's model runner, whose CUDA-graph runners are guarded (plugin.install_graph_guard) at every step
    model_runner: Any = None

    # ------------------------------------------------------------------------------------ translation

    def _view(self, req: Any, prefill: int, context: int, now: float) -> ScheduledRequest:
        arrival, slo = self.arrivals.get(req.rid, (now, None))
        first, last = self.token_times.times(req.rid)
        return ScheduledRequest(request_id=req.rid, arrival_time=arrival, prefill_tokens=prefill,
                                context_tokens=context, output_tokens=len(req.output_ids), first_token_time=first,
                                last_token_time=last, slo=slo)

    def proposed_batch(self, scheduler: Any, batch: Any, step_id: int, running: Any = None) -> ProposedBatch:
        now = time.monotonic()
        scheduled: list[ScheduledRequest] = []
        if batch is not None:
            if batch.forward_mode.is_decode():
                for req in batch.reqs:
                    # KV tokens attended before this step: prompt + outputs, minus the token being fed now.
                    scheduled.append(self._view(req, 0, len(req.origin_input_ids) + len(req.output_ids) - 1, now))
            else:
                # Per-row lengths from the batch: in a mixed batch (SGLang's mixed chunk) a decode row's
                # Req.extend_len still describes its last prefill.
                decoding = {id(r) for r in batch.decoding_reqs or ()}
                for req, ext, pre in zip(batch.reqs, batch.extend_lens, batch.prefix_lens):
                    if id(req) in decoding:
                        scheduled.append(self._view(req, 0, int(pre), now))
                    else:
                        scheduled.append(self._view(req, int(ext), int(pre), now))
        waiting = [self._view(r, len(r.origin_input_ids), 0, now) for r in scheduler.waiting_queue]
        # Without SGLang's mixed chunk a prefill step defers the running batch's decodes: they are waiting too.
        in_step = {id(r) for r in batch.reqs} if batch is not None else set()
        for req in running.reqs if running is not None else ():
            if id(req) not in in_step and not req.finished() and not str(req.rid).startswith(
                    (FINETUNE_RID_PREFIX, PROFILE_RID_PREFIX)):
                waiting.append(self._view(req, 0, len(req.origin_input_ids) + len(req.output_ids) - 1, now))
        proposed = ProposedBatch(step_id=step_id, now=now, scheduled=tuple(scheduled), waiting=tuple(waiting),
                                 mode=ExecutionMode.EAGER)
        if self.graph_mode is not None and proposed.scheduled:
            mode = self.graph_mode(proposed)
            if mode is not ExecutionMode.EAGER:
                proposed = dataclasses.replace(proposed, mode=mode)
        return proposed

    # ------------------------------------------------------------------------------------ hooks

    def around_get_next_batch(self, original: Callable[..., Any], scheduler: Any, *args: Any, **kwargs: Any) -> Any:
        if self.legacy:
            # 0.5.15: the batch alone comes back; the running batch is the scheduler's
            formed = original(scheduler, *args, **kwargs)
            plan = _LegacyPlan(batch_to_run=formed, running_batch=scheduler.running_batch)
            out = self._around_plan(scheduler, plan)
            scheduler.running_batch = out.running_batch
            return out.batch_to_run
        return self._around_plan(scheduler, original(scheduler, *args, **kwargs))

    def _around_plan(self, scheduler: Any, plan: Any) -> Any:
        batch = plan.batch_to_run
        self.idle_requested = False
        step_id = next(self.step_ids)
        proposed = self.proposed_batch(scheduler, batch, step_id, plan.running_batch)
        samples: tuple[FineTuneSample, ...] = ()
        synthetic = profiled = False
        if self.profiling:
            # The warm-up and drain steps of a profile run carry throw-away requests only: their records are
            # synthetic as well, or the core would take them for serving steps nobody offered it.
            synthetic = True
            profiled = self.profile_samples is not None
            samples, self.profile_samples = self.profile_samples or (), None
        elif self.interceptor is not None:
            samples = tuple(self.interceptor.on_schedule(proposed))
        placed: dict[str, FineTuneSample] = {}
        refused: tuple[FineTuneSample, ...] = ()
        if samples:
            joined, placed, refused = self._join(scheduler, plan, step_id, samples)
            if joined is not None:
                plan = joined
                batch = plan.batch_to_run
        self.last_step_executed = batch is not None
        if batch is None and not refused:
            self.plan = None
            return plan
        self.plan = StepPlan(step_id=step_id, samples=placed, synthetic=synthetic, profiled=profiled,
                             prefill_lengths=proposed.prefill_lengths, num_decode=proposed.num_decode,
                             kv_tokens=proposed.kv_tokens, refused=tuple(s.sample_id for s in refused))
        if batch is None:  # refused samples on an idle step: report them now, nothing runs
            self._report(self.plan)
            self.plan = None
        return plan

    # ------------------------------------------------------------------------------------ joining a step

    def _join(self, scheduler: Any, plan: Any, step_id: int, samples: tuple[FineTuneSample, ...]
              ) -> tuple[Any, dict[str, FineTuneSample], tuple[FineTuneSample, ...]]:
        """Add ``samples`` to the step SGLang formed (``plan``).

        Returns (the plan to run or None when nothing was added, placed rows by rid, refused samples).

        SGLang prepares its batch inside ``get_next_batch_to_run`` (request-pool rows, KV slots, prefix matches),
        so the rows are not slipped into that pass. They get a prefill batch of their own from SGLang's own
        admission (``_get_new_batch_prefill_raw`` over a waiting queue holding only them, with the step's rows
        counted as running so request slots, LoRA slots and KV stay within SGLang's limits), and the step's rows
        are then appended behind them: a prefill (or SGLang-mixed) batch by concatenating the prepared extend
        fields, a decode batch by SGLang's own ``ScheduleBatch.mix_with_running`` (its mixed-chunk path). The
        fine-tuning rows come first because SGLang resolves a mixed batch's decode inputs as the batch's tail.
        """
        if self.finetune_lora_id is None:
            raise RuntimeError("fine-tuning samples were injected before set_finetune_adapter() loaded the reserved "
                               "adapter; the core must call set_finetune_adapter first")
        batch = plan.batch_to_run
        tokens = sum(s.num_tokens for s in samples)
        if batch is not None and not _joinable(batch):
            return None, {}, samples
        if batch is not None and batch.forward_mode.is_decode() and batch is not plan.running_batch:
            # SGLang 0.5.23 decodes its running batch in place; anything else is a path this join does not know.
            return None, {}, samples
        taken = 0 if batch is None else (batch.batch_size() if batch.forward_mode.is_decode()
                                         else int(batch.extend_num_tokens))
        # No row may be chunked (its layer inputs would be split over steps): the rows fit the chunk budget left.
        budget = min((x for x in (scheduler.max_prefill_tokens, scheduler.chunked_prefill_size) if x and x > 0),
                     default=tokens + taken)
        if tokens + taken > budget:
            return None, {}, samples
        ft_batch, placed, refused = self._admit(scheduler, plan, step_id, samples)
        if ft_batch is None:
            return None, {}, samples
        from sglang.srt.managers.schedule_batch import ScheduleBatch

        running = plan.running_batch
        if batch is None:
            joined = ft_batch
        elif batch.forward_mode.is_decode():
            # The step is SGLang's decode of its running batch (already prepared for decode): exactly what its
            # mixed-chunk path mixes into a prefill batch. The running batch is then carried by this step and
            # merged back next step, as SGLang does after mixing.
            ft_batch.mix_with_running(batch)
            ft_batch.decoding_reqs = batch.reqs
            running = ScheduleBatch(reqs=[], batch_is_full=batch.batch_is_full)
            joined = ft_batch
        else:
            joined = _prepend_extend(ft_batch, batch)
        return type(plan)(batch_to_run=joined, running_batch=running), placed, refused

    def _admit(self, scheduler: Any, plan: Any, step_id: int, samples: Sequence[FineTuneSample]
               ) -> tuple[Any, dict[str, FineTuneSample], tuple[FineTuneSample, ...]]:
        """SGLang's prefill admission over the fine-tuning rows alone: (prepared batch or None, admitted rows by
        rid, samples SGLang did not admit: no request slot, LoRA slot or KV room left)."""
        from sglang.srt.managers.schedule_batch import ScheduleBatch

        batch = plan.batch_to_run
        counted = list(plan.running_batch.reqs) + ([] if batch is None or batch is plan.running_batch
                                                   else list(batch.reqs))
        # Scheduler state the admission pass reads or writes, swapped for this pass only: the queue holds just the
        # rows, no chunk of the step continues in it, and SGLang's own mixing stays with SGLang's own pass.
        saved = (scheduler.waiting_queue, scheduler.chunked_req, scheduler.is_mixed_chunk)
        saved_running = scheduler.running_batch
        scheduler.waiting_queue, scheduler.chunked_req, scheduler.is_mixed_chunk = [], None, False
        placed: dict[str, FineTuneSample] = {}
        try:
            placed = self._queue(scheduler, step_id, samples)
            if self.legacy:
                # 0.5.15 counts the scheduler's own running batch: the step's rows stand in for it in this pass
                scheduler.running_batch = ScheduleBatch(reqs=counted)
                ft_batch = scheduler._get_new_batch_prefill_raw(prefill_delayer_single_pass=None)
            else:
                ft_batch, _ = scheduler._get_new_batch_prefill_raw(
                    prefill_delayer_single_pass=None, running_batch=ScheduleBatch(reqs=counted))
            stray = [r for r in scheduler.waiting_queue if r.rid not in placed]
            new_chunk = scheduler.chunked_req
        finally:
            scheduler.running_batch = saved_running
            queue, scheduler.waiting_queue, scheduler.chunked_req, scheduler.is_mixed_chunk = (
                scheduler.waiting_queue, *saved)
        # Requests SGLang itself queued during the pass (grammar-ready ones) go back to its queue.
        scheduler.waiting_queue.extend(stray)
        if new_chunk is not None:
            # Excluded by the budget check in _join (no row is longer than the chunk budget left); a chunked
            # fine-tuning row would be forwarded over several steps, which the capture contract forbids.
            raise RuntimeError(f"SGLang chunked fine-tuning row {new_chunk.rid} (budget check bypassed)")
        admitted = {r.rid for r in ft_batch.reqs} if ft_batch is not None else set()
        refused = tuple(s for rid, s in placed.items() if rid not in admitted)
        # Rows SGLang did not admit were only ever in the swapped queue (nothing allocated for them): dropping
        # the queue forgets them, and they are reported aborted in this step's record.
        del queue
        return ft_batch, {rid: s for rid, s in placed.items() if rid in admitted}, refused

    def _queue(self, scheduler: Any, step_id: int, samples: Sequence[FineTuneSample]) -> dict[str, FineTuneSample]:
        import array

        from sglang.srt.managers.io_struct import TokenizedGenerateReqInput
        from sglang.srt.sampling.sampling_params import SamplingParams

        placed: dict[str, FineTuneSample] = {}
        for s in samples:
            rid = f"{FINETUNE_RID_PREFIX}{step_id}-{s.sample_id}-{uuid.uuid4().hex[:8]}"
            params = SamplingParams(max_new_tokens=0, temperature=0.0)
            params.normalize(None)
            req = TokenizedGenerateReqInput(
                rid=rid, input_text="", input_ids=array.array("q", s.input_ids), input_embeds=None, mm_inputs=None,
                token_type_ids=None, sampling_params=params, return_logprob=False, logprob_start_len=-1,
                top_logprobs_num=0, token_ids_logprob=None, stream=False, lora_id=self.finetune_lora_id,
                # A radix-cache namespace of its own: no prefix hit can skip (and so not capture) rows, and
                # no client request ever matches KV these rows leave behind.
                extra_key=rid)
            scheduler.handle_generate_request(req)
            placed[rid] = s
        # Never stored in the radix cache either: SGLang frees a finished row's KV instead of inserting it
        # (Req.skip_radix_cache_insert, read by release_kv_cache in 0.5.15 and 0.5.23).
        for r in scheduler.waiting_queue:
            if r.rid in placed:
                r.skip_radix_cache_insert = True
        return placed

    def around_run_batch(self, original: Callable[..., Any], scheduler: Any, batch: Any, *args: Any,
                         **kwargs: Any) -> Any:
        plan = self.plan
        if plan is None:
            return original(scheduler, batch, *args, **kwargs)
        sink = self.activation_sink if plan.samples and not plan.synthetic else None
        if sink is not None:
            sink.begin_step(plan.step_id, list(plan.samples.values()))
        self._rows = self._row_map(batch, plan)
        if self.model_runner is not None and plan.samples:
            from .plugin import install_graph_guard

            install_graph_guard(self.model_runner, self)  # a no-op unless SGLang replaced a graph runner
        _synchronize()
        plan.start = time.monotonic()
        try:
            result = original(scheduler, batch, *args, **kwargs)
            _synchronize()  # device-complete: on CUDA the launch returns before the forward ends
        finally:
            self._rows = None
        plan.duration = time.monotonic() - plan.start
        plan.ran = True
        # SGLang's own answer: whether the forward replayed a CUDA graph (False on CPU and for guarded steps)
        plan.mode = ExecutionMode.GRAPH if getattr(result, "can_run_cuda_graph", False) else ExecutionMode.EAGER
        if sink is not None and not plan.aborted:  # an abort told the sink already
            sink.end_step(plan.step_id, [s.sample_id for s in plan.samples.values()], [])
        return result

    def forces_eager(self) -> bool:
        """Whether the step about to run carries fine-tuning rows (or calibration's rows), which must run eagerly:
        the capture and abort hooks do not fire inside a replayed CUDA graph. Asked by the guarded graph runners."""
        plan = self.plan
        return plan is not None and bool(plan.samples)

    def should_stop(self) -> bool:
        """Polled before every decoder layer of a step with rows: whether to stop the forward there."""
        plan = self.plan
        if plan is None or plan.synthetic or not plan.ft_only or self.activation_sink is None:
            return False
        return bool(self.activation_sink.should_abort(plan.step_id))

    def stopped(self) -> None:
        """The forward stopped at a layer boundary: every row goes back to the pool, told now, not after the
        sampler and SGLang's result processing have run."""
        plan = self.plan
        assert plan is not None
        plan.aborted = True
        if self.activation_sink is not None:
            self.activation_sink.end_step(plan.step_id, [], [s.sample_id for s in plan.samples.values()])

    _rows: list[tuple[int, int, int]] | None = None

    def _row_map(self, batch: Any, plan: StepPlan) -> list[tuple[int, int, int]] | None:
        if not plan.samples:
            return None
        rows, offset = [], 0
        lens = [1] * len(batch.reqs) if batch.forward_mode.is_decode() else batch.extend_lens
        for req, n in zip(batch.reqs, lens):
            if req.rid in plan.samples:
                rows.append((plan.samples[req.rid].sample_id, offset, n))
            offset += n
        return rows

    def capture(self, layer: int, hidden: torch.Tensor) -> None:
        """``capture_output`` callback of decoder layer ``layer``: the layer's residual-stream input."""
        plan, rows = self.plan, self._rows
        if plan is None or not rows:
            return
        sink = self.activation_sink
        for sample_id, start, n in rows:
            x = hidden[start:start + n]
            if plan.synthetic or sink is None:
                x.clone()  # the copy a capture sink makes, so calibration prices it
            else:
                sink.layer_input(plan.step_id, layer, sample_id, x)

    def around_process_batch_result(self, original: Callable[..., Any], scheduler: Any, batch: Any, *args: Any,
                                    **kwargs: Any) -> Any:
        out = original(scheduler, batch, *args, **kwargs)
        plan, self.plan = self.plan, None
        if plan is not None and plan.ran:
            self._report(plan)
        return out

    def filter_stream(self, reqs: Sequence[Any]) -> list[Any]:
        client = [r for r in reqs if not str(r.rid).startswith((FINETUNE_RID_PREFIX, PROFILE_RID_PREFIX))]
        now = time.monotonic()
        for r in client:
            self.token_times.observe(r.rid, len(r.output_ids), now)
        if self.on_stream is not None and client:
            self.on_stream(client)
        return client

    def _report(self, plan: StepPlan) -> None:
        record = plan.to_record(aborted=plan.aborted, mode=plan.mode)
        if plan.profiled:
            self.profile_record = record
        if self.step_sink is not None:
            self.step_sink(record)


@dataclass
class _LegacyPlan:
    """0.5.15's ``get_next_batch_to_run`` returns the batch alone: the same two fields as 0.5.23's plan."""

    batch_to_run: Any
    running_batch: Any


def _joinable(batch: Any) -> bool:
    """Whether rows can be added to ``batch`` by :func:`_prepend_extend` / ``mix_with_running``.

    Refused (the samples are reported aborted): batches carrying per-row state this adapter does not
    concatenate (input embeddings, replaced embeddings, encoder SWA, logprob inputs, Mamba tracking, beams,
    speculative decoding) and a decode batch SGLang's mixed path would not mix either (logprobs, beams).
    """
    mode = batch.forward_mode
    if not (mode.is_decode() or mode.is_extend()) or mode.is_target_verify() or batch.spec_info is not None:
        return False
    # beams (beam_tail, Req.beam_group) and encoder SWA resets are 0.5.23's; 0.5.15 has neither field
    if batch.return_logprob or getattr(batch, "beam_tail", None) is not None or any(
            getattr(r, "beam_group", None) is not None for r in batch.reqs):
        return False
    if mode.is_decode():
        return True
    return all(getattr(batch, name, None) is None for name in (
        "input_embeds", "replace_embeds", "encoder_swa_reset", "extend_input_logprob_token_ids",
        "mamba_track_indices", "encoder_lens")) and batch.prefill_input_ids_cpu is not None


def _prepend_extend(ft: Any, batch: Any) -> Any:
    """``ft``'s rows, then every row of the prepared extend (or mixed) ``batch``: one batch for one forward."""
    out_cache_loc = torch.cat([ft.out_cache_loc, batch.out_cache_loc])
    input_ids_cpu = torch.cat([ft.prefill_input_ids_cpu, batch.prefill_input_ids_cpu])
    prefix, extend, starts = ft.prefix_lens + batch.prefix_lens, ft.extend_lens + batch.extend_lens, (
        ft.extend_logprob_start_lens + batch.extend_logprob_start_lens)
    num_tokens = ft.extend_num_tokens + batch.extend_num_tokens
    ft.merge_batch(batch)  # SGLang's own concatenation of rows, pool indices, sequence lengths, sampling state
    ft.out_cache_loc, ft.prefill_input_ids_cpu = out_cache_loc, input_ids_cpu
    ft.prefix_lens, ft.extend_lens, ft.extend_logprob_start_lens = prefix, extend, starts
    ft.extend_num_tokens = num_tokens
    ft.input_ids = None  # materialised from prefill_input_ids_cpu (+ the mixed decode tail) at forward entry
    # What SGLang's result processing reads from the step's batch: it stays the batch SGLang formed.
    ft.forward_mode = batch.forward_mode
    ft.mix_running_indices = batch.mix_running_indices
    if hasattr(batch, "mix_running_indices_cpu"):  # 0.5.23; 0.5.15 keeps the device tensor only
        ft.mix_running_indices_cpu = batch.mix_running_indices_cpu
    ft.decoding_reqs = batch.decoding_reqs
    ft.chunked_req = batch.chunked_req
    ft.contains_last_prefill_chunk = batch.contains_last_prefill_chunk
    ft.prefill_stats = batch.prefill_stats
    return ft


def get_binding(scheduler: Any) -> Binding | None:
    return getattr(scheduler, "_deltaserve", None)


def _synchronize() -> None:
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        torch.cuda.synchronize()
