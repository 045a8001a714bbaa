"""``worker_extension_cls``: capture hooks, abort polling and step timing inside vLLM's worker.

vLLM mixes this class into its worker class (as an extra base) and exposes its methods to
``collective_rpc``. :meth:`DeltaServeWorkerExtension.deltaserve_attach` is called once after start-up; it

- connects the model's capture points (:mod:`.layer_tap`, installed by DeltaServe's executor before the first
  forward, so they survive torch.compile) to this worker: vLLM's decoder layer takes
  ``(positions, hidden_states, residual)`` and its fused RMSNorm updates both in place, so the true
  residual-stream input ``hidden_states + residual`` (``residual`` is ``None`` at layer 0) must be read before
  the layer runs. Only fine-tuning rows are sliced out, located where the model runner put them this step;
- makes every step that carries fine-tuning rows run without CUDA graphs (the runner's graph decision is made to
  choose none): a graph replay would skip the capture points; inference-only steps keep vLLM's full and piecewise
  graphs;
- polls ``ActivationSink.should_abort`` at every layer boundary of a fine-tuning-only step and stops the
  forward with a private exception, caught around ``execute_model``, which then returns an empty output;
- wraps the model runner's ``execute_model`` and ``sample_tokens`` on the instance (no class is edited) to
  time the step from the start of the forward to the sampled tokens, and reads the step's CUDA-graph mode
  from vLLM's forward context at layer 0 (a step whose layer hooks never fired was a graph replay).

What differs between vLLM's two GPU model runners -- where a request's rows sit (V1: the persistent
``input_batch``; V2: the ``InputBatch`` its ``prepare_inputs`` built for this step, in its own sorted order), how the
CUDA-graph decision is made and steered (V1: ``cudagraph_dispatcher`` with ``valid_modes``; V2:
``cudagraph_manager`` returning a batch descriptor), which graphs were captured, and how async scheduling is read --
lives in a :class:`~.runner_view.RunnerView` chosen from the runner's type (:func:`~.runner_view.view_for`); this
module holds what both share.

Two steps in flight (async scheduling): plans and timings are keyed by ``id(SchedulerOutput)``, and the engine
keeps each step's SchedulerOutput alive in its batch queue until it processes that step's output, so two steps in
flight never share a key. ``execute_model`` and ``sample_tokens`` of one step are adjacent calls on the worker
(the runner itself carries a single ``execute_model_state`` from one to the other), so one "current step" slot
suffices. On CUDA with async scheduling the step is timed with CUDA events instead of
``torch.cuda.synchronize()``: synchronizing would make the host wait for step N before scheduling step N+1,
which is the overlap async scheduling exists for; the events are read when the scheduler processes the step's
output (:class:`DeferredStepTiming`).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import Any

import torch

from deltaserve_core.types import ExecutionMode

from . import cpu_lora_fix, layer_tap
from .channel import FINETUNE_REQUEST_PREFIX, Channel, StepPlan, StepTiming, get_channel
from .runner_view import RunnerView, every_lora_case, view_for
from .weights import WeightMapping, map_hf_weights

__all__ = ["DeferredStepTiming", "DeltaServeWorkerExtension"]

logger = logging.getLogger(__name__)


class _AbortForward(Exception):
    """Raised from a layer pre-hook to stop a fine-tuning-only forward at a layer boundary."""


class DeferredStepTiming(StepTiming):
    """A step timed with CUDA events, read once its output has been awaited (async scheduling on CUDA).

    ``start`` and ``duration`` are NaN until :meth:`resolve`; ``mode`` and ``aborted`` are known when the step
    leaves the worker. The device clock is mapped to this process's monotonic clock through one event recorded
    at a synchronized point (:class:`_DeviceClock`).
    """

    def __init__(self, clock: _DeviceClock, start: Any, end: Any, mode: ExecutionMode, aborted: bool) -> None:
        super().__init__(float("nan"), float("nan"), mode, aborted)
        self._clock, self._start, self._end = clock, start, end

    def resolve(self) -> StepTiming:
        # The engine has awaited this step's sampled tokens, so the end event is complete or about to be: this
        # waits for at most the tail of the step, never for a later one.
        self._end.synchronize()
        return StepTiming(self._clock.monotonic(self._start), self._start.elapsed_time(self._end) / 1e3, self.mode,
                          self.aborted)


class _DeviceClock:
    """Maps a CUDA event to ``time.monotonic()``: an anchor event recorded at a synchronized point."""

    def __init__(self) -> None:
        torch.cuda.synchronize()
        self._anchor = torch.cuda.Event(enable_timing=True)
        self._anchor.record()
        self._anchor.synchronize()
        self._anchor_time = time.monotonic()

    def monotonic(self, event: Any) -> float:
        return self._anchor_time + self._anchor.elapsed_time(event) / 1e3


class _Step:
    """The step the worker is executing right now."""

    def __init__(self, key: int, plan: StepPlan | None, scheduler_output: Any) -> None:
        self.key = key
        self.plan = plan
        self.scheduler_output = scheduler_output
        self.mode: ExecutionMode | None = None  # set by the layer-0 hook; None means no hook fired
        # Read from the request ids themselves, not the plan: a step whose plan the worker cannot find must still
        # run without graphs (a replay would skip its captures) and be reported.
        self.has_ft_rows = plan is not None and bool(plan.samples) or any(
            str(rid).startswith(FINETUNE_REQUEST_PREFIX) for rid in scheduler_output.num_scheduled_tokens)
        self.dispatched: list[str] = []  # the CUDA-graph modes the runner's dispatcher chose for this step
        self.rows: list[tuple[int, int, int]] | None = None  # (sample id, first row, num rows)
        self.start = 0.0
        self.start_event: Any = None  # CUDA event when timed without synchronizing
        self.aborted = False


class _WorkerState:
    def __init__(self, channel: Channel, runner: Any, num_layers: int, view: RunnerView | None = None) -> None:
        self.channel = channel
        self.runner = runner
        self.view = view if view is not None else view_for(runner)
        self.num_layers = num_layers
        self.step: _Step | None = None
        self.clock = _DeviceClock() if self.view.async_scheduling and _cuda_ready() else None
        # The last engine step's forward was aborted: vLLM's batch-queue loop (async scheduling) still calls
        # sample_tokens for it, which the view answers (RunnerView.sample_after_abort)
        self.after_abort = False

    # -- rows -----------------------------------------------------------------------------------------

    def _rows(self, step: _Step) -> list[tuple[int, int, int]]:
        # Where the runner put each fine-tuning request's tokens this step (the view knows the runner's layout).
        if step.rows is None:
            samples = step.plan.samples if step.plan is not None else {}
            step.rows = self.view.rows(step.scheduler_output, samples)
        return step.rows

    # -- hooks ----------------------------------------------------------------------------------------

    def on_layer(self, layer: int, hidden: torch.Tensor, residual: torch.Tensor | None) -> None:
        """The tap's receiver (:mod:`.layer_tap`): decoder layer ``layer`` is about to run on ``hidden``."""
        step = self.step
        if step is None:
            return
        if layer == 0:
            step.mode = _forward_mode()
        plan = step.plan
        if plan is None or not plan.samples:
            return
        sink = self.channel.activation_sink
        if plan.ft_only and not plan.synthetic and sink is not None and sink.should_abort(plan.step_id):
            step.aborted = True
            raise _AbortForward
        for sample_id, start, n in self._rows(step):
            x = hidden[start:start + n]
            if residual is not None:
                x = x + residual[start:start + n]
            if plan.synthetic or sink is None:
                x.clone()  # the copy a capture sink makes, so calibration prices it
            else:
                sink.layer_input(plan.step_id, layer, sample_id, x)

    def dispatch(self, original: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        # A CUDA graph replays without running the tap: a step with fine-tuning rows runs without one, so every
        # capture and every abort poll happens (its rows are priced with eager coefficients for this reason).
        step = self.step
        no_graphs = step is not None and step.has_ft_rows
        result, mode = self.view.dispatch(original, no_graphs, *args, **kwargs)
        if no_graphs:
            step.dispatched.append(mode)  # type: ignore[union-attr]
        return result

    # -- execute / sample -----------------------------------------------------------------------------

    def execute(self, original: Callable[..., Any], scheduler_output: Any, *args: Any, **kwargs: Any) -> Any:
        if not self.view.engine_step(args, kwargs):
            return original(scheduler_output, *args, **kwargs)
        self.after_abort = False
        if scheduler_output.total_num_scheduled_tokens == 0:
            return original(scheduler_output, *args, **kwargs)
        self.view.begin_step()
        key = id(scheduler_output)
        plan = self.channel.plans.get(key)
        step = self.step = _Step(key, plan, scheduler_output)
        if step.has_ft_rows and (plan is None or not plan.samples):
            logger.error("DeltaServe: a step carries fine-tuning rows but the worker has no plan for it (key %d, "
                         "plan %s): it runs without CUDA graphs, and its rows are not captured", key,
                         "missing" if plan is None else f"step {plan.step_id} without samples")
        sink = self.channel.activation_sink if plan is not None and plan.samples and not plan.synthetic else None
        if sink is not None:
            sink.begin_step(plan.step_id, list(plan.samples.values()))  # type: ignore[union-attr]
        if self.clock is not None:
            step.start_event = torch.cuda.Event(enable_timing=True)
            step.start_event.record()
        else:
            _synchronize()
        step.start = time.monotonic()
        try:
            result = original(scheduler_output, *args, **kwargs)
        except _AbortForward:
            result = self.view.aborted_output()
            self.after_abort = True
        if sink is not None:
            ids = [s.sample_id for s in plan.samples.values()]  # type: ignore[union-attr]
            sink.end_step(plan.step_id, [] if step.aborted else ids, ids if step.aborted else [])  # type: ignore[union-attr]
        if result is not None:  # the runner finished the step itself (abort, empty, pooling): no sample_tokens
            self._finish(step)
        return result

    def sample(self, original: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        if self.after_abort:  # the batch-queue loop samples every step, the aborted one too (already finished)
            self.after_abort = False
            return self.view.sample_after_abort(original, *args, **kwargs)
        result = original(*args, **kwargs)
        if self.step is not None:
            self._finish(self.step)
        return result

    def _finish(self, step: _Step) -> None:
        mode = step.mode if step.mode is not None else ExecutionMode.GRAPH
        if step.has_ft_rows and mode is not ExecutionMode.EAGER and not step.aborted:
            # Never expected: the dispatcher was told to run this step without graphs. Said loudly, with what the
            # runner chose, because the step's captures are missing (the record reports the mode truthfully).
            logger.error("DeltaServe: step %s carried fine-tuning rows but ran %s (layer-0 capture point %s; "
                         "dispatcher chose %s)", step.plan.step_id if step.plan is not None else "?", mode.value,
                         "never ran" if step.mode is None else "ran", step.dispatched or "nothing")
        if self.clock is not None and step.start_event is not None:
            end = torch.cuda.Event(enable_timing=True)
            end.record()
            self.channel.timings[step.key] = DeferredStepTiming(self.clock, step.start_event, end, mode, step.aborted)
        else:
            _synchronize()
            self.channel.timings[step.key] = StepTiming(step.start, time.monotonic() - step.start, mode,
                                                        step.aborted)
        self.step = None


def _forward_mode() -> ExecutionMode:
    from vllm.config import CUDAGraphMode
    from vllm.forward_context import get_forward_context, is_forward_context_available

    if not is_forward_context_available():
        return ExecutionMode.EAGER
    mode = getattr(get_forward_context(), "cudagraph_runtime_mode", CUDAGraphMode.NONE)
    return ExecutionMode.EAGER if mode == CUDAGraphMode.NONE else ExecutionMode.GRAPH


#: kept under its old name for callers and tests
_every_lora_case = every_lora_case


def _compiled(worker: Any) -> bool:
    """Whether vLLM runs this worker's model through torch.compile (any mode but NONE, unless enforce_eager)."""
    config = worker.vllm_config  # type: ignore[attr-defined]
    if config.model_config.enforce_eager:
        return False
    return int(config.compilation_config.mode) != 0


def _cuda_ready() -> bool:
    return torch.cuda.is_available() and torch.cuda.is_initialized()


def _synchronize() -> None:
    # Device-complete times: the forward is asynchronous on CUDA.
    if _cuda_ready():
        torch.cuda.synchronize()


class DeltaServeWorkerExtension:
    """Mixed into vLLM's worker; its ``deltaserve_*`` methods are called through ``collective_rpc``."""

    def deltaserve_attach(self, channel_key: str) -> int:
        """Install hooks and timing wrappers (idempotent); return the number of decoder layers."""
        existing = getattr(self, "_deltaserve_state", None)
        if existing is not None:
            return existing.num_layers
        channel = get_channel(channel_key)
        # Fine-tuning rows and published versions fill every LoRA slot; on CPU vLLM would then apply the last
        # slot's adapter to base-model rows (cpu_lora_fix says why and until when).
        cpu_lora_fix.apply()
        runner = self.model_runner  # type: ignore[attr-defined]
        tap = getattr(self, "_deltaserve_tap", None)
        if tap is None:
            if _compiled(self):
                raise RuntimeError("vLLM compiled this model before DeltaServe's capture points were installed: "
                                   "run the engine on DeltaServe's executor (deltaserve_vllm.executor), which "
                                   "installs them before the first forward")
            tap = self.deltaserve_install_taps()
        view = view_for(runner)
        view.check_supported()
        state = _WorkerState(channel, runner, tap.num_layers, view)
        tap.connect(state.on_layer)
        # execute_model, sample_tokens and the runner's graph decision go through the worker (RunnerView.install)
        view.install(state.execute, state.sample, state.dispatch)
        logger.info("DeltaServe attached to vLLM's %s model runner (%s)", view.name, type(runner).__name__)
        self._deltaserve_state = state
        channel.worker_attached = True
        return tap.num_layers

    def deltaserve_runner_kind(self) -> str:
        """Which of vLLM's model runners this worker runs, as the worker extension sees it: ``"V1"`` (vLLM's V1
        GPU runner, or the CPU runner derived from it) or ``"V2"`` (:mod:`.runner_view`)."""
        state = getattr(self, "_deltaserve_state", None)
        return (state.view if state is not None else view_for(self.model_runner)).name  # type: ignore[attr-defined]

    def deltaserve_install_taps(self) -> layer_tap.Tap:
        """Put a capture point at every decoder layer's input (idempotent). Called by DeltaServe's executor right
        after the model is loaded, before its first forward: a model vLLM compiles is traced once, then."""
        tap = getattr(self, "_deltaserve_tap", None)
        if tap is None:
            layers = self.model_runner.get_model().model.layers  # type: ignore[attr-defined]
            tap = self._deltaserve_tap = layer_tap.install(layers, compiled=_compiled(self))
        return tap

    def deltaserve_base_weights(self) -> WeightMapping:
        """The loaded model's weights under transformers' names, as views (:func:`.weights.map_hf_weights`), or the
        reason they cannot be lent. Views are only views in the caller's process: both DeltaServe executors run this
        worker in the caller's process, where ``collective_rpc`` returns the object itself."""
        return map_hf_weights(self.model_runner.get_model(),  # type: ignore[attr-defined]
                              self.vllm_config.model_config.hf_config)  # type: ignore[attr-defined]

    def deltaserve_graph_sizes(self) -> dict[str, list[int]]:
        """The CUDA graphs this runner captured: all capture sizes, the uniform-decode FULL graph sizes and the
        mixed-batch (PIECEWISE) graph sizes, each counted only if captured for every LoRA case.

        Read from the runner's own graph decision (V1: the ``cudagraph_dispatcher``'s keys; V2: the
        ``cudagraph_manager``, asked per size and LoRA case). Empty when the runner has none (CPU) or captured
        nothing (``enforce_eager``, ``cudagraph_mode`` NONE).
        """
        state = getattr(self, "_deltaserve_state", None)
        view = state.view if state is not None else view_for(self.model_runner)  # type: ignore[attr-defined]
        config = self.vllm_config.compilation_config  # type: ignore[attr-defined]
        return view.graph_sizes(config.cudagraph_capture_sizes or [])

    def deltaserve_job_call(self, op: str, args: dict[str, Any] | None = None) -> dict[str, Any]:
        """One jobs-API call (:meth:`deltaserve_core.runtime.EngineRuntime.job_call`, ``create`` included) against
        this engine's job.

        The executor is vLLM's one-process executor (see :mod:`.plugin`), so this worker runs in the EngineCore
        process beside the runtime, and between two engine steps (``collective_rpc`` is an engine utility call):
        the job is read, changed or started on the thread that drives its steps."""
        from .serving import current_runtime

        runtime = current_runtime()
        if runtime is None:
            return {"status": 503, "error": {"message": "DeltaServe has not started in this engine yet",
                                             "type": "service_unavailable", "param": None, "code": "job_not_started"}}
        return runtime.job_call(op, args)
