"""``worker_extension_cls``: capture hooks, abort polling and step timing inside vLLM's worker.

vLLM mixes this class into its worker class (as an extra base) and exposes its methods to
``collective_rpc``. :meth:`DeltaServeWorkerExtension.deltaserve_attach` is called once after start-up; it

- registers a forward *pre*-hook on every ``model.model.layers[i]``: vLLM's decoder layer takes
  ``(positions, hidden_states, residual)`` and its fused RMSNorm updates both in place, so the true
  residual-stream input ``hidden_states + residual`` (``residual`` is ``None`` at layer 0) must be read before
  the layer runs. Only fine-tuning rows are sliced out (rows located through the model runner's
  ``input_batch.req_ids`` order and the step's per-request token counts);
- polls ``ActivationSink.should_abort`` at every layer boundary of a fine-tuning-only step and stops the
  forward with a private exception, caught around ``execute_model``, which then returns an empty output;
- wraps the model runner's ``execute_model`` and ``sample_tokens`` on the instance (no class is edited) to
  time the step from the start of the forward to the sampled tokens, and reads the step's CUDA-graph mode
  from vLLM's forward context at layer 0 (a step whose layer hooks never fired was a graph replay).
"""

from __future__ import annotations

import functools
import time
from collections.abc import Callable
from typing import Any

import torch

from deltaserve_core.types import ExecutionMode

from .channel import Channel, StepPlan, StepTiming, get_channel

__all__ = ["DeltaServeWorkerExtension"]


class _AbortForward(Exception):
    """Raised from a layer pre-hook to stop a fine-tuning-only forward at a layer boundary."""


class _Step:
    """The step the worker is executing right now."""

    def __init__(self, key: int, plan: StepPlan | None, scheduler_output: Any) -> None:
        self.key = key
        self.plan = plan
        self.scheduler_output = scheduler_output
        self.mode: ExecutionMode | None = None  # set by the layer-0 hook; None means no hook fired
        self.rows: list[tuple[int, int, int]] | None = None  # (sample id, first row, num rows)
        self.start = 0.0
        self.aborted = False


class _WorkerState:
    def __init__(self, channel: Channel, runner: Any, num_layers: int) -> None:
        self.channel = channel
        self.runner = runner
        self.num_layers = num_layers
        self.step: _Step | None = None

    # -- rows -----------------------------------------------------------------------------------------

    def _rows(self, step: _Step) -> list[tuple[int, int, int]]:
        # The runner lays rows out request by request in input_batch order (after any reordering it did in
        # _update_states), each request contributing its scheduled token count.
        if step.rows is None:
            counts = step.scheduler_output.num_scheduled_tokens
            samples = step.plan.samples if step.plan is not None else {}
            rows, offset = [], 0
            for rid in self.runner.input_batch.req_ids:
                n = counts.get(rid, 0)
                if rid in samples:
                    rows.append((samples[rid].sample_id, offset, n))
                offset += n
            step.rows = rows
        return step.rows

    # -- hooks ----------------------------------------------------------------------------------------

    def pre_hook(self, layer: int, module: torch.nn.Module, args: tuple, kwargs: dict) -> None:
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
        hidden = args[1] if len(args) > 1 else kwargs["hidden_states"]
        residual = args[2] if len(args) > 2 else kwargs.get("residual")
        for sample_id, start, n in self._rows(step):
            x = hidden[start:start + n]
            if residual is not None:
                x = x + residual[start:start + n]
            if plan.synthetic or sink is None:
                x.clone()  # the copy a capture sink makes, so calibration prices it
            else:
                sink.layer_input(plan.step_id, layer, sample_id, x)

    # -- execute / sample -----------------------------------------------------------------------------

    def execute(self, original: Callable[..., Any], scheduler_output: Any, *args: Any, **kwargs: Any) -> Any:
        if scheduler_output.total_num_scheduled_tokens == 0:
            return original(scheduler_output, *args, **kwargs)
        key = id(scheduler_output)
        plan = self.channel.plans.get(key)
        step = self.step = _Step(key, plan, scheduler_output)
        sink = self.channel.activation_sink if plan is not None and plan.samples and not plan.synthetic else None
        if sink is not None:
            sink.begin_step(plan.step_id, list(plan.samples.values()))  # type: ignore[union-attr]
        _synchronize()
        step.start = time.monotonic()
        try:
            result = original(scheduler_output, *args, **kwargs)
        except _AbortForward:
            from vllm.v1.outputs import EMPTY_MODEL_RUNNER_OUTPUT

            result = EMPTY_MODEL_RUNNER_OUTPUT
        if sink is not None:
            ids = [s.sample_id for s in plan.samples.values()]  # type: ignore[union-attr]
            sink.end_step(plan.step_id, [] if step.aborted else ids, ids if step.aborted else [])  # type: ignore[union-attr]
        if result is not None:  # the runner finished the step itself (abort, empty, pooling): no sample_tokens
            self._finish(step)
        return result

    def sample(self, original: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        result = original(*args, **kwargs)
        if self.step is not None:
            self._finish(self.step)
        return result

    def _finish(self, step: _Step) -> None:
        _synchronize()
        mode = step.mode if step.mode is not None else ExecutionMode.GRAPH
        self.channel.timings[step.key] = StepTiming(step.start, time.monotonic() - step.start, mode, step.aborted)
        self.step = None


def _forward_mode() -> ExecutionMode:
    from vllm.config import CUDAGraphMode
    from vllm.forward_context import get_forward_context, is_forward_context_available

    if not is_forward_context_available():
        return ExecutionMode.EAGER
    mode = getattr(get_forward_context(), "cudagraph_runtime_mode", CUDAGraphMode.NONE)
    return ExecutionMode.EAGER if mode == CUDAGraphMode.NONE else ExecutionMode.GRAPH


def _synchronize() -> None:
    # Device-complete times: the forward is asynchronous on CUDA.
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        torch.cuda.synchronize()


class DeltaServeWorkerExtension:
    """Mixed into vLLM's worker; its ``deltaserve_*`` methods are called through ``collective_rpc``."""

    def deltaserve_attach(self, channel_key: str) -> int:
        """Install hooks and timing wrappers (idempotent); return the number of decoder layers."""
        existing = getattr(self, "_deltaserve_state", None)
        if existing is not None:
            return existing.num_layers
        channel = get_channel(channel_key)
        runner = self.model_runner  # type: ignore[attr-defined]
        layers = runner.get_model().model.layers
        state = _WorkerState(channel, runner, len(layers))
        for i, layer in enumerate(layers):
            layer.register_forward_pre_hook(functools.partial(state.pre_hook, i), with_kwargs=True)
        # Instance attributes shadow the runner's methods for this runner only; vLLM's worker calls
        # self.model_runner.execute_model / sample_tokens, so every step goes through these.
        runner.execute_model = functools.partial(state.execute, runner.execute_model)
        runner.sample_tokens = functools.partial(state.sample, runner.sample_tokens)
        self._deltaserve_state = state
        channel.worker_attached = True
        return len(layers)

    def deltaserve_graph_sizes(self) -> dict[str, list[int]]:
        """The CUDA graphs this runner captured: all capture sizes and the uniform-decode FULL graph sizes.

        Read from the runner's ``cudagraph_dispatcher`` (the keys it replays from). Empty when the runner has no
        dispatcher (CPU) or captured nothing (``enforce_eager``, ``cudagraph_mode`` NONE).
        """
        runner = self.model_runner  # type: ignore[attr-defined]
        dispatcher = getattr(runner, "cudagraph_dispatcher", None)
        if dispatcher is None or not getattr(dispatcher, "keys_initialized", False):
            return {"capture_sizes": [], "decode_sizes": []}
        from vllm.config import CUDAGraphMode

        if dispatcher.cudagraph_mode == CUDAGraphMode.NONE:
            return {"capture_sizes": [], "decode_sizes": []}
        keys = dispatcher.cudagraph_keys.get(CUDAGraphMode.FULL, set())
        uniform = [k for k in keys if getattr(k, "uniform", False)]
        # A size counts only if it was captured both with and without active LoRAs (vLLM's default,
        # cudagraph_specialize_lora=True): the prediction cannot see which adapters a batch uses.
        decode = sorted({k.num_tokens for k in uniform if not k.has_lora}
                        & {k.num_tokens for k in uniform if k.has_lora})
        sizes = sorted(int(x) for x in (runner.compilation_config.cudagraph_capture_sizes or []))
        return {"capture_sizes": sizes, "decode_sizes": decode}
