"""Every S-LoRA method DeltaServe wraps, in one place, with the record of why and what breaks it.

Nothing in the user's checkout is edited: the wraps are applied at run time, before the router steps, and
removed by :func:`uninstall`. Router-side wraps are on the *instances* (this router, its request queue, its
``ModelRpcServer``); the three model-side wraps are on the class ``LoraUnorderedBatchInfer`` because S-LoRA builds
a fresh instance of it inside every ``forward`` (its layers are plain classes, not ``nn.Module``: there are no
module hooks to use). The class wraps pass straight through unless a step of this process's DeltaServe host is
running. :data:`PATCHES` is the record (``docs/slora-adapter.md`` prints it); :func:`install` refuses to wrap
anything not in it and reports what it wrapped, which the GPU test compares with the record.

This module imports S-LoRA only inside :func:`install` (after :func:`deltaserve_slora.locate.activate`).
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import time
import types
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from deltaserve_core import hostkit
from deltaserve_core.hostkit import HookSlots, PatchRecord, check_patch_records
from deltaserve_core.types import (
    ExecutionMode,
    FineTuneSample,
    ProposedBatch,
    RequestSLO,
    ScheduledRequest,
    StepRecord,
)

__all__ = ["FINETUNE_REQUEST_PREFIX", "PATCHES", "ROUTER_PATCHES", "Channel", "Patch", "StepPlan", "StopForward",
           "install", "install_arrivals", "install_idle_loop", "install_router_start", "install_server_entry",
           "loaded_reserve", "note_arrival", "recover", "uninstall", "uninstall_operator"]

_log = logging.getLogger("deltaserve.slora")

#: S-LoRA request ids of fine-tuning rows (client ids with this prefix are refused by the host).
FINETUNE_REQUEST_PREFIX = "__deltaserve_ft__"


#: S-LoRA's upstream status, the same for every patch: the project has had no release and no commit since
#: c1ddf48 (Jan 2024), so there is nobody to take a hook upstream to.
_UPSTREAM = "none possible: S-LoRA is unmaintained (no release, last commit c1ddf48, Jan 2024)"
_REMOVE = "when DeltaServe drops S-LoRA, or a maintained fork offers a per-step scheduling hook that replaces it"


def Patch(target: str, scope: str, why: str, breaks_if: str, applies: str = "router",
          remove_when: str = _REMOVE) -> PatchRecord:
    """One S-LoRA patch's record. ``scope``: "instance" (this router/queue/server object), "class" (every instance
    in the process) or "module"; ``applies``: "router" (every router DeltaServe runs in: SloraHost and the operator
    path) or "operator" (only deltaserve_slora.launch, S-LoRA's own API server)."""
    return PatchRecord(target=target, how=scope, why=why, upstream=_UPSTREAM, remove_when=remove_when,
                       breaks_if=breaks_if, applies=applies)


PATCHES: tuple[PatchRecord, ...] = (
    Patch("slora.server.router.req_queue.ReqQueue.generate_new_batch", "instance",
          "batch formation: S-LoRA's proposed prefill batch is offered to the core's on_schedule; returned samples "
          "are appended to that same batch as 1-token (max_new_tokens=1) requests on the reserved adapter, all or "
          "nothing (token budget, request slots, free KV cells). With nothing running and nothing to prefill an "
          "empty batch is offered, so the core can issue a fine-tuning-only step",
          "the signature (current_batch, lora_ranks) -> Batch | None, Batch(batch_id, reqs), Req fields, or "
          "RouterManager._step calling it per prefill decision change"),
    Patch("slora.server.router.manager.RouterManager._decode_batch", "instance",
          "decode steps are offered to on_schedule too (once per step); S-LoRA never mixes prefill and decode, so "
          "samples returned for a decode step are refused (reported as aborted), never run; emits the StepRecord",
          "decode no longer going through _decode_batch(batch), or Req.output_ids/input_len changing"),
    Patch("slora.server.router.manager.RouterManager._prefill_batch", "instance",
          "binds the step plan to the batch being prefilled and emits its StepRecord after S-LoRA processed the "
          "step's outputs (tokens appended, finished rows retired)",
          "_prefill_batch(batch, minibatch) renamed or the per-step flow in RouterManager._step changing"),
    Patch("slora.server.router.manager.RouterManager._send_to_detokenization_proc", "instance",
          "output filter: fine-tuning rows' sampled token is dropped before the detokenizer, so it never reaches the "
          "output stage or a client (add_req is never called for them, so the detokenizer never knew them)",
          "a second path to the detokenizer, or req_ans losing its {request_id: (token, metadata)} shape"),
    Patch("slora.server.router.model_infer.model_rpc.ModelRpcServer.forward", "instance",
          "truthful step time (torch.cuda.synchronize before and after the forward + sampling); begin_step/end_step; "
          "locates fine-tuning rows in the step (prefill rows are packed in request order); loads the zero adapter "
          "used by the base-request fix below",
          "forward(batch_id, is_prefill) renamed, InferBatch.requests/input_lengths changing, or TP > 1 (rpyc)"),
    Patch("slora.models.peft.lora_unordered_batch_infer.LoraUnorderedBatchInfer._lora_context_forward", "class",
          "per-layer capture: the residual stream entering decoder layer i (input_embs, updated in place by the "
          "layer, so the sink copies it) is handed to the activation sink for each fine-tuning row; before that, in "
          "a fine-tuning-only step, the sink's should_abort is polled and StopForward raised when it answers True "
          "(the _context_forward wrap below ends the forward there)",
          "_context_forward no longer calling self._lora_context_forward(i, input_embs, infer_state, ...) per layer"),
    Patch("slora.models.peft.lora_unordered_batch_infer.LoraUnorderedBatchInfer.__init__", "class",
          "fixes S-LoRA's base-request bug: rows without an adapter keep req_bins == 0 and silently get adapter #0 of "
          "the pool applied whenever they share a step with LoRA rows (fine-tuning rows make that common). Such rows "
          "are pointed at an all-zero adapter instead, so their LoRA delta is exactly 0",
          "req_bins/infer_adapter.idx_map renamed, or S-LoRA fixing the bug itself",
          remove_when="when S-LoRA (or the fork in use) fixes the base-request bug: the GPU test's stock run then "
          "no longer reproduces it"),
    Patch("slora.server.api_server.start_router_process", "module",
          "operator path, in the launcher process: S-LoRA's api_server.main spawns its router process with this "
          "name as the target; the launcher points it at deltaserve_slora.launch.router_process (picklable, so the "
          "spawned process runs it), which restores S-LoRA's module-level setting (nccl_port, max_req_total_len: "
          "api_server.main sets them in its own process only, so under spawn S-LoRA's router uses the defaults and "
          "ignores --nccl_port), installs the wrap below and then runs S-LoRA's own start_router_process",
          "api_server.main no longer starting the router as mp.Process(target=start_router_process, args=(args, "
          "router_port, detokenization_port, model_rpc_ports, mode, pipe_writer)) through its module-level name",
          applies="operator"),
    Patch("slora.server.router.manager.RouterManager.wait_to_model_ready", "class",
          "operator path, in the router process only: once the RouterManager and its ModelRpcServer exist (and before "
          "S-LoRA reports 'init ok' to the API server), DeltaServe attaches: the patches above, the stored latency "
          "profile and the CoServer. A failure there reaches the operator through S-LoRA's own init pipe",
          "start_router_process no longer awaiting router.wait_to_model_ready() before pipe_writer.send('init ok'), "
          "or TP > 1 (model_rpcs[0].model is then an rpyc proxy)", applies="operator"),
    Patch("slora.server.router.manager.RouterManager.loop_for_fwd", "instance",
          "operator path: S-LoRA's loop steps an idle router every 10 ms; while fine-tuning-only steps run it steps "
          "again at once (still yielding to loop_for_netio_req, so arriving requests are taken first), and after a "
          "step that ran nothing it waits the 10 ms as S-LoRA does. SIGINT/SIGTERM stop it at a step boundary, then "
          "the final checkpoint is written",
          "loop_for_fwd/_step renamed, start_router_process no longer running it as a task next to "
          "loop_for_netio_req on one event loop, or running_batch no longer None when the router is idle",
          applies="operator"),
    Patch("slora.server.router.manager.RouterManager.add_req", "instance",
          "operator path: requests from S-LoRA's HTTP server enter here (loop_for_netio_req); their arrival time is "
          "recorded for the schedule views' TTFT/TPOT and the core is told (on_arrival), as SloraHost.submit does "
          "for the driver's requests (both through note_arrival). Its lora_dir is translated to the S-LoRA folder "
          "serving it (a published version may be named by its version name or its durable copy), and a folder "
          "S-LoRA does not know, or the reserved fine-tuning adapter's, is refused at once (HTTP 499): stock "
          "S-LoRA queues it and its scheduler raises KeyError on it in every later step",
          "add_req(adapter_dir, prompt_ids, sampling_params, request_id) renamed, or requests entering the queue "
          "another way", applies="operator"),
    Patch("slora.models.peft.lora_unordered_batch_infer.LoraUnorderedBatchInfer._context_forward", "class",
          "abort: the per-layer wrap above polls the activation sink's should_abort before every decoder layer of a "
          "fine-tuning-only step and raises StopForward at the boundary where it answers True; this wrap of the "
          "prefill layer loop catches it, tells the sink (end_step, every sample aborted) and returns the logits "
          "S-LoRA's sampler expects (zeros, [batch, vocab], float32: what post_infer.token_forward returns), so "
          "ModelRpcServer.forward and the router finish the step as any other: the rows (max_new_tokens=1) take "
          "their one token, retire, and their KV cells are freed; their token never reaches the output stage "
          "(output filter above). No layer, final norm or LM head runs after the abort",
          "_context_forward(input_ids, infer_state, no_lora_compute) no longer being the prefill forward's layer loop "
          "over _lora_context_forward whose return value sample() takes, infer_state.batch_size or "
          "base_model.pre_post_weight.lm_head_weight_ renamed, or TP > 1 (lm_head_weight_ is then a vocab shard)",
          remove_when="when DeltaServe drops S-LoRA, or a maintained fork offers a stoppable forward (the abort "
          "goes with the per-layer wrap)"),
    Patch("slora.server.router.model_infer.infer_adapter.InferAdapter.offload_adapters", "instance",
          "fixes S-LoRA's offload crash: offload_adapters(reserve) with a non-empty reserve that keeps none of the "
          "loaded adapters (e.g. {None}: only base rows left) raises IndexError at `new_a_start[0] = 0` after it "
          "already cleared idx_map/adapter_dirs and freed the cells, so _handle_finish_req never filters the model "
          "batch (router and model batches diverge: KeyError in _add_token_id_to_req on every later decode) and the "
          "pool index is corrupt. Fine-tuning rows make that routine: a prefill loads the reserved adapter and the "
          "zero adapter, the fine-tuning rows retire, and the first decode that finishes a base row while another "
          "runs offloads with reserve {None}. The wrap passes only the reserved dirs that are loaded, so 'keep none' "
          "takes S-LoRA's own offload-everything path and 'keep all' its no-op path",
          "offload_adapters(reserve_adapter_dirs) renamed, InferAdapter.adapter_dirs renamed, or "
          "ModelRpcServer.exposed_offload_adapters no longer calling self.infer_adapter.offload_adapters",
          remove_when="when S-LoRA (or the fork in use) handles an offload that keeps no adapter: "
          "benchmarks/gpu/slora_repro.py --stock-offload then reports the scenario passing without the wrap"),
    Patch("slora.server.api_server.start_detokenization_process", "module",
          "operator path, Python >= 3.12 with uvloop >= 0.22: S-LoRA's detokenizer process calls "
          "asyncio.get_event_loop() with no loop set, which uvloop's policy refuses (RuntimeError: no current event "
          "loop), so the server never answers. api_server.main spawns it through this module-level name; the launcher "
          "points it at deltaserve_slora.launch.detokenization_process (picklable by name under spawn), which sets a "
          "new event loop and then runs S-LoRA's own start_detokenization_process unchanged",
          "api_server.main no longer starting the detokenizer as mp.Process(target=start_detokenization_process, "
          "...) through its module-level name", applies="operator",
          remove_when="when S-LoRA creates its detokenizer's event loop itself (asyncio.new_event_loop / "
          "asyncio.run), or DeltaServe drops S-LoRA"),
)

#: the patches every router DeltaServe runs in gets (:func:`install`); the rest are the operator path's
ROUTER_PATCHES: tuple[PatchRecord, ...] = tuple(p for p in PATCHES if p.applies == "router")
check_patch_records(PATCHES)


@dataclass
class StepPlan(hostkit.StepPlan):
    #: the forward stopped at a layer boundary because the sink asked (fine-tuning-only steps only)
    aborted: bool = False

    @property
    def ft_only(self) -> bool:
        return bool(self.samples) and not self.prefill_lengths and not self.num_decode


class StopForward(Exception):
    """Raised at a layer boundary of a fine-tuning-only step whose sink asked to abort (caught by the
    ``_context_forward`` wrap)."""


@dataclass
class _Info:
    arrival: float
    slo: RequestSLO | None = None
    first: float | None = None
    last: float | None = None


@dataclass
class Channel(HookSlots):
    """State the wraps share with the host object (one DeltaServe host per process)."""

    reserved_dir: str | None = None  # S-LoRA adapter dir of the reserved fine-tuning adapter
    zero_dir: str | None = None  # all-zero adapter for base rows that share a step with LoRA rows
    step_ids: Any = field(default_factory=itertools.count)
    plans: dict[str, StepPlan] = field(default_factory=dict)  # S-LoRA batch id -> plan of the step about to run
    current: StepPlan | None = None
    offer_idle: bool = True
    profile_records: list[StepRecord] = field(default_factory=list)
    info: dict[str, _Info] = field(default_factory=dict)
    installed: list[str] = field(default_factory=list)
    refused_decode_samples: int = 0
    forwards: int = 0  # forwards run (run_idle_step's answer)
    on_token: Callable[[str, int, bool], None] | None = None  # driver's client-output path (tests only)


_ACTIVE: Channel | None = None  # the channel whose step is in forward (class-level wraps read it)
_UNDO: list[Callable[[], None]] = []
#: the operator path's wraps (their own list: install() refuses to run twice, but the launch wraps precede it)
_LAUNCH_UNDO: list[Callable[[], None]] = []


def _wrap(owner: Any, attr: str, name: str, make: Callable[[Callable[..., Any]], Callable[..., Any]],
          installed: list[str], undo_list: list[Callable[[], None]] = _UNDO) -> None:
    if name not in {p.target for p in PATCHES}:
        raise RuntimeError(f"deltaserve_slora: {name} is not in the patch record (patches.PATCHES)")
    original = getattr(owner, attr, None)
    if original is None:
        raise RuntimeError(f"deltaserve_slora: S-LoRA has no {name}; this S-LoRA is not a tested version")
    is_class = isinstance(owner, (type, types.ModuleType))  # restored by value, not by deleting an override
    raw = owner.__dict__[attr] if is_class else original
    setattr(owner, attr, make(raw))
    installed.append(name)

    def undo() -> None:
        if is_class:
            setattr(owner, attr, raw)
        else:
            try:
                delattr(owner, attr)  # back to the class's method
            except AttributeError:
                pass
    undo_list.append(undo)


def _view_waiting(ch: Channel, req: Any, now: float) -> ScheduledRequest:
    info = ch.info.get(req.request_id) or _Info(now)
    return ScheduledRequest(request_id=req.request_id, arrival_time=info.arrival, prefill_tokens=req.input_len,
                            context_tokens=0, output_tokens=0, slo=info.slo)


def _view_decode(ch: Channel, req: Any, now: float) -> ScheduledRequest:
    info = ch.info.get(req.request_id) or _Info(now)
    return ScheduledRequest(request_id=req.request_id, arrival_time=info.arrival, prefill_tokens=0,
                            # the newest token is this step's input: KV holds prompt + earlier outputs
                            context_tokens=req.input_len + len(req.output_ids) - 1,
                            output_tokens=len(req.output_ids), first_token_time=info.first,
                            last_token_time=info.last, slo=info.slo)


def install(router: Any, server: Any, ch: Channel) -> list[str]:
    """Apply every patch of :data:`PATCHES` to this router/server; returns the names applied (in order)."""
    global _ACTIVE
    import torch
    from slora.models.peft.lora_unordered_batch_infer import LoraUnorderedBatchInfer
    from slora.server.io_struct import Batch, Req
    from slora.server.sampling_params import SamplingParams

    if _UNDO:
        raise RuntimeError("deltaserve_slora: patches are already installed in this process (one host per process)")
    _ACTIVE = None
    queue = router.req_queue
    params = router.input_params

    def ft_params() -> Any:
        sp = SamplingParams(do_sample=False, ignore_eos=True, max_new_tokens=1)
        sp.stop_sequences = []
        return sp

    def make_ft_reqs(step_id: int, samples: tuple[FineTuneSample, ...]) -> dict[str, Any]:
        if ch.reserved_dir is None:
            raise RuntimeError("fine-tuning samples were injected before set_finetune_adapter() loaded the reserved "
                               "adapter; the core must call set_finetune_adapter first")
        return {f"{FINETUNE_REQUEST_PREFIX}{step_id}-{s.sample_id}": s for s in samples}

    def fits(batch_reqs: list[Any], current: Any, samples: tuple[FineTuneSample, ...]) -> bool:
        ft_tokens = sum(s.num_tokens for s in samples)
        tokens = sum(r.input_len for r in batch_reqs) + ft_tokens
        running = len(current.reqs) if current is not None else 0
        free = server.model.mem_manager.can_use_mem_size
        # this step allocates its prompt rows now, plus pool cells for adapters loaded for it (4r each)
        adapter_cells = 4 * max(router.lora_ranks.values() or [0]) * 2
        return (tokens <= params.batch_max_tokens and running + len(batch_reqs) + len(samples) <= params.running_max_req_size
                and tokens + adapter_cells <= free)

    # -- batch formation ---------------------------------------------------------------------------------
    def wrap_generate(orig: Callable[..., Any]) -> Callable[..., Any]:
        def generate_new_batch(current_batch: Any, lora_ranks: dict[Any, int]) -> Any:
            batch = orig(current_batch, lora_ranks)
            if batch is None and current_batch is not None:
                return None  # the step is a decode: _decode_batch offers it
            if batch is None and not (ch.offer_idle or ch.profile_samples):
                return None
            now = time.monotonic()
            reqs = list(batch.reqs) if batch is not None else []
            step_id = next(ch.step_ids)
            waiting = [_view_waiting(ch, r, now) for r in queue.waiting_req_list if not r.aborted]
            waiting += [_view_decode(ch, r, now) for r in (current_batch.reqs if current_batch is not None else [])]
            proposed = ProposedBatch(step_id=step_id, now=now, scheduled=tuple(_view_waiting(ch, r, now) for r in reqs),
                                     waiting=tuple(waiting), mode=ExecutionMode.EAGER)
            synthetic = False
            if ch.profiling:
                samples, ch.profile_samples, synthetic = tuple(ch.profile_samples or ()), None, True
            elif ch.interceptor is not None:
                samples = tuple(ch.interceptor.on_schedule(proposed))
            else:
                samples = ()
            plan = StepPlan(step_id=step_id, prefill_lengths=proposed.prefill_lengths, synthetic=synthetic)
            if samples and fits(reqs, current_batch, samples):
                plan.samples = make_ft_reqs(step_id, samples)
                reqs += [Req(ch.reserved_dir, rid, list(s.input_ids), ft_params()) for rid, s in plan.samples.items()]
            elif samples:
                plan.refused = tuple(s.sample_id for s in samples)
            if not reqs:
                if plan.refused and ch.step_sink is not None:  # nothing runs; the samples go back to the pool
                    ch.step_sink(StepRecord(step_id=step_id, start_time=now, duration_s=0.0,
                                            mode=ExecutionMode.EAGER, aborted_sample_ids=plan.refused))
                return None
            new_batch = Batch(batch.batch_id if batch is not None else uuid.uuid4().hex, reqs)
            ch.plans[new_batch.batch_id] = plan
            return new_batch
        return generate_new_batch

    _wrap(queue, "generate_new_batch", PATCHES[0].target, wrap_generate, ch.installed)

    def report(plan: StepPlan) -> None:
        record = plan.to_record(aborted=plan.aborted)
        if plan.synthetic:
            ch.profile_records.append(record)
        elif ch.step_sink is not None:
            ch.step_sink(record)

    # -- decode steps ------------------------------------------------------------------------------------
    def wrap_decode(orig: Callable[..., Any]) -> Callable[..., Any]:
        async def _decode_batch(batch: Any) -> Any:
            now = time.monotonic()
            step_id = next(ch.step_ids)
            views = tuple(_view_decode(ch, r, now) for r in batch.reqs)
            proposed = ProposedBatch(step_id=step_id, now=now, scheduled=views,
                                     waiting=tuple(_view_waiting(ch, r, now) for r in queue.waiting_req_list
                                                   if not r.aborted), mode=ExecutionMode.EAGER)
            plan = StepPlan(step_id=step_id, num_decode=proposed.num_decode, kv_tokens=proposed.kv_tokens,
                            synthetic=ch.profiling)
            if ch.interceptor is not None and not ch.profiling:
                refused = tuple(ch.interceptor.on_schedule(proposed))
                if refused:  # S-LoRA cannot add prefill rows to a decode step (capabilities: mixed_batches=False)
                    ch.refused_decode_samples += len(refused)
                    plan.refused = tuple(s.sample_id for s in refused)
            ch.plans[batch.batch_id] = plan
            out = await orig(batch)
            ch.plans.pop(batch.batch_id, None)
            report(plan)
            return out
        return _decode_batch

    _wrap(router, "_decode_batch", PATCHES[1].target, wrap_decode, ch.installed)

    def wrap_prefill(orig: Callable[..., Any]) -> Callable[..., Any]:
        async def _prefill_batch(batch: Any, minibatch: bool = True) -> Any:
            plan = ch.plans.get(batch.batch_id)
            if plan is None:  # a batch formed outside generate_new_batch (S-LoRA has none): still one record
                plan = StepPlan(step_id=next(ch.step_ids), prefill_lengths=tuple(r.input_len for r in batch.reqs))
                ch.plans[batch.batch_id] = plan
            out = await orig(batch, minibatch)
            ch.plans.pop(batch.batch_id, None)
            report(plan)
            return out
        return _prefill_batch

    _wrap(router, "_prefill_batch", PATCHES[2].target, wrap_prefill, ch.installed)

    # -- output filter -------------------------------------------------------------------------------------
    def wrap_send(orig: Callable[..., Any]) -> Callable[..., Any]:
        def _send_to_detokenization_proc(batch: Any, req_ans: dict[str, Any]) -> Any:
            now = time.monotonic()
            kept = {rid: v for rid, v in req_ans.items() if not rid.startswith(FINETUNE_REQUEST_PREFIX)}
            for rid in kept:
                info = ch.info.get(rid)
                if info is not None:
                    info.first = info.first if info.first is not None else now
                    info.last = now
                    if batch.id_to_reqs[rid].has_generate_finished:
                        ch.info.pop(rid, None)
            return orig(batch, kept)
        return _send_to_detokenization_proc

    _wrap(router, "_send_to_detokenization_proc", PATCHES[3].target, wrap_send, ch.installed)

    # -- forward: timing, rows, zero adapter ---------------------------------------------------------------
    def wrap_forward(orig: Callable[..., Any]) -> Callable[..., Any]:
        def forward(batch_id: Any, is_prefill: bool) -> Any:
            global _ACTIVE
            infer_batch = server.cache[batch_id]
            plan = ch.plans.get(batch_id)
            rows: dict[int, tuple[int, int]] = {}
            if plan is not None and plan.samples and is_prefill:
                start = 0
                for req, n in zip(infer_batch.requests, infer_batch.input_lengths):
                    sample = plan.samples.get(req["request_id"])
                    if sample is not None:
                        rows[sample.sample_id] = (start, n)
                    start += n
            dirs = set(infer_batch.adapter_dirs)
            if None in dirs and len(dirs) > 1:
                _ensure_zero_adapter(server, ch)
            sink = ch.activation_sink if rows and not (plan is not None and plan.synthetic) else None
            if sink is not None:
                sink.begin_step(plan.step_id, list(plan.samples.values()))  # type: ignore[union-attr]
            ch.current, _ACTIVE = plan, ch
            ch.forwards += 1
            _CAPTURE.update(sink=sink, rows=rows, step_id=plan.step_id if plan is not None else -1,
                            synthetic_rows=rows if sink is None else {},
                            abortable=_abortable(plan, sink, rows, len(infer_batch.requests)))
            torch.cuda.synchronize()
            start_t = time.monotonic()
            try:
                return orig(batch_id, is_prefill)
            finally:
                torch.cuda.synchronize()
                end_t = time.monotonic()
                ch.current, _ACTIVE = None, None
                _CAPTURE.update(_IDLE_CAPTURE)
                if plan is not None:
                    plan.start, plan.duration, plan.ran = start_t, end_t - start_t, True
                if sink is not None and not plan.aborted:  # type: ignore[union-attr]  # an abort told the sink already
                    ids = [s.sample_id for s in plan.samples.values()]  # type: ignore[union-attr]
                    sink.end_step(plan.step_id, ids, [])  # type: ignore[union-attr]
        return forward

    _wrap(server, "forward", PATCHES[4].target, wrap_forward, ch.installed)

    # -- model side (class-level; inert unless _ACTIVE) ----------------------------------------------------
    _wrap(LoraUnorderedBatchInfer, "_lora_context_forward", PATCHES[5].target, _wrap_layer, ch.installed)

    def wrap_init(orig: Callable[..., Any]) -> Callable[..., Any]:
        def __init__(self: Any, base_model: Any, adapters: list[Any], infer_adapter: Any = None) -> None:
            orig(self, base_model, adapters, infer_adapter)
            active = _ACTIVE
            if active is None or infer_adapter is None or active.zero_dir is None:
                return
            if any(a is None for a in adapters) and any(a is not None for a in adapters):
                zero = infer_adapter.idx_map.get(active.zero_dir)
                if zero is None:
                    raise RuntimeError("deltaserve_slora: the zero adapter for base rows is not in the pool")
                for i, a in enumerate(adapters):
                    if a is None:
                        self.req_bins[i] = zero
        return __init__

    _wrap(LoraUnorderedBatchInfer, "__init__", PATCHES[6].target, wrap_init, ch.installed)
    _wrap(LoraUnorderedBatchInfer, "_context_forward", PATCHES[11].target, _wrap_context_forward, ch.installed)

    # -- adapter offload (S-LoRA crash when the reserve keeps no loaded adapter) -------------------------------
    pool = server.infer_adapter

    def wrap_offload(orig: Callable[..., Any]) -> Callable[..., Any]:
        def offload_adapters(reserve_adapter_dirs: Any = None, *args: Any, **kwargs: Any) -> Any:
            return orig(loaded_reserve(pool.adapter_dirs, reserve_adapter_dirs), *args, **kwargs)
        return offload_adapters

    _wrap(pool, "offload_adapters", PATCHES[12].target, wrap_offload, ch.installed)
    return list(ch.installed)


#: what the class-level model wraps read: the step's sink and rows (set by the forward wrap for one forward)
_IDLE_CAPTURE: dict[str, Any] = {"sink": None, "rows": {}, "step_id": -1, "synthetic_rows": {}, "abortable": None}
_CAPTURE: dict[str, Any] = dict(_IDLE_CAPTURE)


def _abortable(plan: StepPlan | None, sink: Any, rows: dict[int, tuple[int, int]], num_requests: int
               ) -> StepPlan | None:
    """The plan of a forward that may stop at a layer boundary, else None: a served (not synthetic) prefill whose
    rows are all fine-tuning rows, with a sink capturing them. Rows that share a step with client rows are never
    aborted (they complete with it), and calibration steps run whole."""
    if plan is None or sink is None or plan.synthetic or not plan.ft_only or len(rows) != num_requests:
        return None
    return plan


def _should_stop() -> bool:
    """Polled before every decoder layer of a prefill (the layer wrap): whether to stop the forward there."""
    plan = _CAPTURE["abortable"]
    return plan is not None and bool(_CAPTURE["sink"].should_abort(plan.step_id))


def _stopped() -> None:
    """The forward stopped at a layer boundary: every row goes back to the pool, told now, not after the sampler
    and S-LoRA's result processing have run. The step's record (``_prefill_batch`` wrap) lists them aborted."""
    plan = _CAPTURE["abortable"]
    plan.aborted = True
    _CAPTURE["sink"].end_step(plan.step_id, [], list(plan.sample_ids))


def _wrap_layer(orig: Callable[..., Any]) -> Callable[..., Any]:
    """``LoraUnorderedBatchInfer._lora_context_forward`` (one decoder layer of a prefill): the abort poll, then the
    layer's input handed to the sink for each fine-tuning row, then the layer."""
    def _lora_context_forward(self: Any, layer_id: int, input_embs: Any, infer_state: Any,
                              no_lora_compute: bool = False) -> Any:
        if _should_stop():
            raise StopForward
        sink = _CAPTURE["sink"]
        if sink is not None:
            for sid, (s, n) in _CAPTURE["rows"].items():
                sink.layer_input(_CAPTURE["step_id"], layer_id, sid, input_embs[s:s + n])
        else:
            for s, n in _CAPTURE["synthetic_rows"].values():  # calibration prices the copy a sink makes
                input_embs[s:s + n].clone()
        return orig(self, layer_id, input_embs, infer_state, no_lora_compute)
    return _lora_context_forward


def _wrap_context_forward(orig: Callable[..., Any]) -> Callable[..., Any]:
    """``LoraUnorderedBatchInfer._context_forward`` (the prefill's layer loop, then final norm and LM head): a
    :class:`StopForward` from a layer boundary ends it with the logits S-LoRA's sampler takes (zeros: the step
    holds only fine-tuning rows, finished by ``max_new_tokens=1`` whatever they sample), so S-LoRA's own
    ``ModelRpcServer.forward`` and router finish the rows and free their KV cells as after any step."""
    def _context_forward(self: Any, input_ids: Any, infer_state: Any, no_lora_compute: bool = False) -> Any:
        try:
            return orig(self, input_ids, infer_state, no_lora_compute)
        except StopForward:
            _stopped()
            return _empty_logits(self.base_model, infer_state.batch_size, input_ids)
    return _context_forward


def _empty_logits(base_model: Any, batch_size: int, input_ids: Any) -> Any:
    """Zero logits shaped as ``post_infer.token_forward(..., return_logics=True)`` returns them (TP=1)."""
    import torch

    vocab = int(base_model.pre_post_weight.lm_head_weight_.shape[0])
    return torch.zeros((batch_size, vocab), dtype=torch.float32, device=input_ids.device)


def loaded_reserve(loaded: Any, reserve: Any) -> list[Any]:
    """The offload wrap's reserve: the adapters of ``reserve`` that are loaded (``loaded``), in order, once each.
    ``None`` (base rows) and adapters not in the pool drop out, so S-LoRA's offload sees [] when it keeps nothing
    (its offload-everything path) and the whole pool when it keeps everything (its no-op path)."""
    pool = set(loaded)
    return [d for d in dict.fromkeys(reserve or ()) if d in pool]


def _ensure_zero_adapter(server: Any, ch: Channel) -> None:
    if ch.zero_dir is None:
        raise RuntimeError("deltaserve_slora: no zero adapter registered for base rows")
    if ch.zero_dir not in server.infer_adapter.idx_map:
        server.infer_adapter.load_adapters([server.adapters[server.adapter_id[ch.zero_dir]]])


def recover(router: Any, server: Any, ch: Channel) -> list[str]:
    """After a step raised: bring router and model state back to one consistent, empty running state.

    A step that raises part-way (S-LoRA updates the router's ``Batch`` and the model's ``InferBatch`` in separate
    calls) can leave them disagreeing about which requests run, and every later decode then fails. This drops the
    running batch on both sides (its KV cells are freed where the model batch is intact), offloads every adapter
    (rebuilding the pool index if the failure left it inconsistent), and clears this step's plan. Waiting requests
    stay queued. Returns the ids of the requests that were running: they get no further output."""
    global _ACTIVE
    dropped: list[str] = []
    batch = router.running_batch
    if batch is not None:
        dropped += [r.request_id for r in batch.reqs]
    for batch_id in list(server.cache):
        infer_batch = server.cache.pop(batch_id)
        dropped += [r["request_id"] for r in infer_batch.requests if r["request_id"] not in dropped]
        try:
            infer_batch.free_self()
        except Exception:  # noqa: BLE001 - a batch the failure left half-built: its cells stay allocated
            pass
    router.running_batch = None
    router.has_wait_tokens = 0
    pool = server.infer_adapter
    if len(pool.adapter_dirs) == int(pool.a_start.shape[0]) == len(pool.idx_map):
        pool.offload_adapters([])
    else:  # S-LoRA's offload failed half-way: its index no longer matches its cells; start from an empty pool
        fresh = type(pool).init(pool.mem_manager, pool.prefetch_stream)
        for name in ("adapter_dirs", "a_loc", "a_start", "a_len", "a_scaling", "idx_map", "prefetch_tag", "cur_tag"):
            setattr(pool, name, getattr(fresh, name))
    ch.plans.clear()
    ch.current, _ACTIVE = None, None
    _CAPTURE.update(_IDLE_CAPTURE)
    return [rid for rid in dropped if not rid.startswith(FINETUNE_REQUEST_PREFIX)]


def uninstall() -> None:
    """Remove every wrap (instance wraps fall back to the class methods, class wraps are restored)."""
    global _ACTIVE
    while _UNDO:
        _UNDO.pop()()
    _ACTIVE = None


# ---------------------------------------------------------------------------------------- operator path
#: how long an idle router waits before looking for work again: S-LoRA's own loop_for_fwd interval
IDLE_WAIT_S = 0.01


def install_server_entry(api_server: types.ModuleType, entry: Callable[..., None],
                         detokenizer_entry: Callable[..., None]) -> list[str]:
    """Launcher process: S-LoRA's ``api_server.main`` spawns its router process with ``entry`` and its detokenizer
    process with ``detokenizer_entry`` (same arguments as S-LoRA's).

    Both must be picklable by reference (S-LoRA's server uses the spawn start method)."""
    names: list[str] = []
    _wrap(api_server, "start_router_process", PATCHES[7].target, lambda _orig: entry, names, _LAUNCH_UNDO)
    _wrap(api_server, "start_detokenization_process", PATCHES[13].target, lambda _orig: detokenizer_entry, names,
          _LAUNCH_UNDO)
    return names


def install_router_start(router_cls: type, on_ready: Callable[[Any], None]) -> list[str]:
    """Router process: ``on_ready(router)`` runs once the router's model server exists, before S-LoRA reports
    'init ok' to its API server, so whatever ``on_ready`` raises fails S-LoRA's start-up with the traceback."""
    def wrap(orig: Callable[..., Any]) -> Callable[..., Any]:
        async def wait_to_model_ready(self: Any) -> Any:
            out = await orig(self)
            on_ready(self)
            return out
        return wait_to_model_ready

    names: list[str] = []
    _wrap(router_cls, "wait_to_model_ready", PATCHES[8].target, wrap, names, _LAUNCH_UNDO)
    return names


def install_idle_loop(router: Any, ch: Channel, wants_idle_step: Callable[[], bool],
                      stop_requested: Callable[[], bool], on_signal: Callable[[], None]) -> list[str]:
    """Router process: replaces this router's ``loop_for_fwd`` (see the record). When ``stop_requested()`` turns
    true (``on_signal`` runs on SIGINT/SIGTERM) the loop returns after the current step and cancels the router's
    other tasks, which ends S-LoRA's ``run_until_complete(loop_for_netio_req())`` with ``CancelledError``."""
    import signal

    def wrap(orig: Callable[..., Any]) -> Callable[..., Any]:
        async def loop_for_fwd() -> None:
            loop = asyncio.get_running_loop()
            for sig in (signal.SIGINT, signal.SIGTERM):
                loop.add_signal_handler(sig, on_signal)
            while not stop_requested():
                before = ch.forwards
                try:
                    await router._step()
                except Exception:  # noqa: BLE001 - the loop must survive a failed step (S-LoRA's would die)
                    dropped = recover(router, router.model_rpcs[0].model, ch)
                    _log.exception("S-LoRA step failed; running batch dropped (requests %s get no further output), "
                                   "engine state reset", dropped)
                    await asyncio.sleep(IDLE_WAIT_S)
                    continue
                if router.running_batch is not None:
                    router.stats_tool.print_stats()  # as S-LoRA's loop; its next _step yields to netio
                elif ch.forwards > before and wants_idle_step():
                    await asyncio.sleep(0)  # a fine-tuning-only step ran: more may be admissible now
                else:
                    await asyncio.sleep(IDLE_WAIT_S)
            me = asyncio.current_task()
            for task in asyncio.all_tasks():
                if task is not me:
                    task.cancel()
        return loop_for_fwd

    names: list[str] = []
    _wrap(router, "loop_for_fwd", PATCHES[9].target, wrap, names, _LAUNCH_UNDO)
    return names


def note_arrival(ch: Channel, request_id: str, now: float, slo: RequestSLO | None = None) -> None:
    """A client request arrived: its timing for the schedule views, and the core's ``on_arrival``."""
    ch.info[request_id] = _Info(now, slo)
    if ch.interceptor is not None:
        ch.interceptor.on_arrival(request_id, now)


def install_arrivals(router: Any, ch: Channel, resolve: Callable[[str | None], str | None]) -> list[str]:
    """Router process: every request S-LoRA's HTTP server sends is noted (:func:`note_arrival`) as it is queued,
    with its ``lora_dir`` translated by ``resolve`` to the S-LoRA folder serving it. A folder ``resolve`` refuses
    (``LookupError``) is answered at once as S-LoRA answers an aborted request (HTTP 499): queued, stock S-LoRA's
    scheduler raises ``KeyError`` on it in every later step, and the reserved fine-tuning adapter is never served."""
    from slora.server.io_struct import BatchAbortReq

    def wrap(orig: Callable[..., Any]) -> Callable[..., Any]:
        def add_req(adapter_dir: Any, prompt_ids: Any, sampling_params: Any, request_id: str) -> Any:
            try:
                served = resolve(adapter_dir)
            except LookupError as exc:
                _log.error("request %s refused: %s", request_id, exc)
                router.send_to_detokenization.send_pyobj(BatchAbortReq([request_id]))
                return None
            note_arrival(ch, request_id, time.monotonic())
            return orig(served, prompt_ids, sampling_params, request_id)
        return add_req

    names: list[str] = []
    _wrap(router, "add_req", PATCHES[10].target, wrap, names, _LAUNCH_UNDO)
    return names


def uninstall_operator() -> None:
    """Remove the operator path's wraps (the router patches stay until :func:`uninstall`)."""
    while _LAUNCH_UNDO:
        _LAUNCH_UNDO.pop()()
