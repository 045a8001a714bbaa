"""What the worker extension needs from vLLM's model runner, once per runner kind (V1 and V2).

The worker extension (:mod:`.worker`) does the same things on every runner: it times a step from its forward to
its sampled tokens, reads each fine-tuning row's layer inputs, polls for an abort at layer boundaries and makes a
step carrying fine-tuning rows run without CUDA graphs. *Where* those things attach differs between vLLM's two GPU
model runners, so that part is a :class:`RunnerView`, chosen from the runner's type by :func:`view_for` (the way
vLLM's ``lora/punica_wrapper`` picks one implementation per platform):

``V1RunnerView`` -- ``vllm.v1.worker.gpu_model_runner.GPUModelRunner`` and its subclasses (vLLM-CPU's
``CPUModelRunner``):

- rows: the runner keeps a persistent ``input_batch`` and lays tokens out request by request in
  ``input_batch.req_ids`` order (after the reordering it does in ``_update_states``), each request contributing
  its scheduled token count;
- graphs: ``cudagraph_dispatcher.dispatch(..., valid_modes=...)`` returns ``(runtime mode, batch descriptor)``;
  a step with fine-tuning rows is asked with ``valid_modes={NONE}``;
- captured graphs: the dispatcher's ``cudagraph_keys``.

``V2RunnerView`` -- ``vllm.v1.worker.gpu.model_runner.GPUModelRunner`` (vLLM's "model runner V2"):

- rows: there is no persistent input batch. Every step, ``execute_model`` updates the runner's request states,
  sorts the scheduled requests (decodes first, then by token count: ``sort_batch_req_ids``) and builds a fresh
  ``InputBatch`` in ``prepare_inputs``; its ``req_ids`` and ``query_start_loc_np`` say where each request's tokens
  sit in the flattened batch. The view wraps ``prepare_inputs`` on the instance and keeps the batch it returned for
  the step being run: the order is read from what the runner really used, not re-derived;
- graphs: ``cudagraph_manager.dispatch(num_reqs, num_tokens, uniform_token_count, num_active_loras, ...)``
  returns a ``BatchExecutionDescriptor`` (FULL replays through ``run_fullgraph`` without a forward context,
  PIECEWISE through the compiled model, NONE eagerly). There is no ``valid_modes``: for a step with fine-tuning
  rows the view replaces the descriptor by the one the manager itself returns when nothing matches (mode NONE,
  the step's own token and request counts, unpadded), keeping its LoRA case;
- captured graphs: read by asking the manager's ``dispatch`` for every capture size and LoRA case it captured
  (``lora_capture_cases``), i.e. the same question the runner asks per step;
- ``execute_model`` is also the runner's own dummy-run entry (``_dummy_run`` calls it with ``dummy_run=True``):
  those calls are no engine step and pass through untouched;
- async scheduling is read from the scheduler config (the V2 runner has no ``use_async_scheduling``).

Both runners split a step the same way -- ``execute_model`` runs the forward and returns ``None``,
``sample_tokens`` samples -- and vLLM's worker calls both through ``self.model_runner``, so both are wrapped by
instance attributes (no class is edited). A forward stopped by an abort returns vLLM's
``EMPTY_MODEL_RUNNER_OUTPUT`` from ``execute_model`` on both: neither runner sets its ``execute_model_state``
before the forward has finished. The synchronous engine loop then does not call ``sample_tokens``; the batch-queue
loop (async scheduling) calls it for every step with tokens. V1's runner answers that call with an empty output
itself; V2's answers ``None``, which the loop takes for a failed ``execute_model`` (it raises "unexpected error"),
so for V2 the view answers with the aborted step's empty output instead (:meth:`RunnerView.sample_after_abort`).
The V2 runner's per-request GPU state of the aborted rows is dropped when the scheduler finishes them (next step's
``finished_req_ids``), as with V1.
"""

from __future__ import annotations

import dataclasses
import functools
import inspect
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterable, Mapping, Sequence
from types import SimpleNamespace
from typing import Any

__all__ = ["Row", "RunnerView", "V1RunnerView", "V2RunnerView", "every_lora_case", "is_v2_runner",
           "rows_at_offsets", "rows_in_order", "view_for"]

#: (sample id, first row in the flattened token batch, number of rows)
Row = tuple[int, int, int]

#: the module of vLLM's V2 GPU model runner class (``vllm/v1/worker/gpu/model_runner.py``, vLLM 0.26 and 0.32)
V2_RUNNER_MODULE = "vllm.v1.worker.gpu.model_runner"

_NO_GRAPHS: dict[str, list[int]] = {"capture_sizes": [], "decode_sizes": [], "piecewise_sizes": []}


def is_v2_runner(runner: Any) -> bool:
    """Whether ``runner`` is (a subclass of) vLLM's V2 GPU model runner. Decided from the class, without importing
    the V2 runner (which a V1 or CPU engine never loads)."""
    return any(c.__module__ == V2_RUNNER_MODULE and c.__name__ == "GPUModelRunner" for c in type(runner).__mro__)


def view_for(runner: Any) -> RunnerView:
    """The view matching ``runner``'s type: V2 for vLLM's V2 GPU runner, V1 for every other (GPU V1, CPU)."""
    return V2RunnerView(runner) if is_v2_runner(runner) else V1RunnerView(runner)


def rows_in_order(req_ids: Iterable[str | None], counts: Mapping[str, int], samples: Mapping[str, Any]) -> list[Row]:
    """Rows when requests are laid out back to back in ``req_ids`` order, each with its ``counts`` tokens (V1).

    ``req_ids`` may hold requests not scheduled this step (count 0) and empty slots (``None``)."""
    rows, offset = [], 0
    for rid in req_ids:
        n = counts.get(rid, 0) if rid is not None else 0
        if rid in samples:
            rows.append((samples[rid].sample_id, offset, n))
        offset += n
    return rows


def rows_at_offsets(req_ids: Sequence[str], starts: Sequence[int], counts: Sequence[int],
                    samples: Mapping[str, Any]) -> list[Row]:
    """Rows when request ``i`` of the batch starts at ``starts[i]`` with ``counts[i]`` tokens (V2's InputBatch:
    ``req_ids``, ``query_start_loc_np``, ``num_scheduled_tokens``)."""
    return [(samples[rid].sample_id, int(starts[i]), int(counts[i])) for i, rid in enumerate(req_ids)
            if rid in samples]


class RunnerView(ABC):
    """The runner-specific part of the worker extension. One per attached runner."""

    #: short name for logs and errors
    name: str = ""

    def __init__(self, runner: Any) -> None:
        self.runner = runner

    # -- configuration ----------------------------------------------------------------------------------

    def check_supported(self) -> None:
        """Raise if this runner is configured in a way the worker extension cannot follow."""

    @property
    @abstractmethod
    def async_scheduling(self) -> bool:
        """Whether the engine overlaps steps (two in flight): the worker then times steps with CUDA events."""

    # -- a step -------------------------------------------------------------------------------------------

    def engine_step(self, args: tuple, kwargs: dict) -> bool:
        """Whether an ``execute_model(*args, **kwargs)`` call is an engine step (not the runner's own dummy run)."""
        return True

    def begin_step(self) -> None:
        """A new engine step starts (forget what the previous one left)."""

    @abstractmethod
    def rows(self, scheduler_output: Any, samples: Mapping[str, Any]) -> list[Row]:
        """Where the requests in ``samples`` (request id -> sample) sit in the step's flattened token batch. Called
        from the layer-0 capture point, i.e. after the runner has prepared the step's inputs."""

    @abstractmethod
    def dispatch(self, original: Callable[..., Any], no_graphs: bool, *args: Any,
                 **kwargs: Any) -> tuple[Any, str]:
        """Run the runner's CUDA-graph decision ``original(*args, **kwargs)``; when ``no_graphs``, make it choose
        no graph. Returns what the runner gets back and the mode it runs in, as text."""

    @staticmethod
    def aborted_output() -> Any:
        """What ``execute_model`` returns for a forward stopped at a layer boundary."""
        from vllm.v1.outputs import EMPTY_MODEL_RUNNER_OUTPUT

        return EMPTY_MODEL_RUNNER_OUTPUT

    def sample_after_abort(self, original: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        """``sample_tokens`` for a step whose forward was aborted (its ``execute_model`` already returned
        :meth:`aborted_output`). Only vLLM's batch-queue loop (async scheduling) calls it: it samples every step
        with tokens right after ``execute_model``, whatever that returned."""
        return original(*args, **kwargs)

    # -- wiring ------------------------------------------------------------------------------------------

    def install(self, execute: Callable[..., Any], sample: Callable[..., Any], dispatch: Callable[..., Any]) -> None:
        """Route the runner's ``execute_model``, ``sample_tokens`` and graph decision through the worker:
        ``execute(original, *args, **kwargs)``, ``sample(original, ...)``, ``dispatch(original, ...)``. Instance
        attributes shadow the methods for this runner only; vLLM's worker calls ``self.model_runner.execute_model``
        / ``sample_tokens``, so every step goes through them."""
        runner = self.runner
        runner.execute_model = functools.partial(execute, runner.execute_model)
        runner.sample_tokens = functools.partial(sample, runner.sample_tokens)
        decider = self._graph_decider()
        if decider is not None:
            decider.dispatch = functools.partial(dispatch, decider.dispatch)

    @abstractmethod
    def _graph_decider(self) -> Any:
        """The object whose ``dispatch`` picks a step's CUDA-graph mode, or None (CPU)."""

    @abstractmethod
    def graph_sizes(self, capture_sizes: Sequence[int]) -> dict[str, list[int]]:
        """The CUDA graphs this runner captured (see ``DeltaServeWorkerExtension.deltaserve_graph_sizes``)."""


def _none_mode() -> Any:
    from vllm.config import CUDAGraphMode

    return CUDAGraphMode.NONE


def every_lora_case(keys: Iterable[Any]) -> list[int]:
    """Token counts captured for every LoRA case the keys distinguish (``has_lora``, ``num_active_loras``)."""
    by_case: dict[tuple[bool, int], set[int]] = {}
    for k in keys:
        by_case.setdefault((bool(getattr(k, "has_lora", False)), int(getattr(k, "num_active_loras", 0) or 0)),
                           set()).add(int(k.num_tokens))
    if not by_case or not any(has_lora for has_lora, _ in by_case):
        return []  # captured without LoRA only: a batch with an active adapter would not replay them
    return sorted(set.intersection(*by_case.values()))


class V1RunnerView(RunnerView):
    """vLLM's V1 model runner (``gpu_model_runner.GPUModelRunner``; vLLM-CPU's runner derives from it)."""

    name = "V1"

    @property
    def async_scheduling(self) -> bool:
        return bool(getattr(self.runner, "use_async_scheduling", False))

    def rows(self, scheduler_output: Any, samples: Mapping[str, Any]) -> list[Row]:
        return rows_in_order(self.runner.input_batch.req_ids, scheduler_output.num_scheduled_tokens, samples)

    def dispatch(self, original: Callable[..., Any], no_graphs: bool, *args: Any, **kwargs: Any) -> tuple[Any, str]:
        if no_graphs:
            kwargs["valid_modes"] = {_none_mode()}
            kwargs.pop("invalid_modes", None)
        result = original(*args, **kwargs)
        return result, str(result[0])

    def _graph_decider(self) -> Any:
        return getattr(self.runner, "cudagraph_dispatcher", None)

    def graph_sizes(self, capture_sizes: Sequence[int]) -> dict[str, list[int]]:
        dispatcher = self._graph_decider()
        if dispatcher is None or not getattr(dispatcher, "keys_initialized", False):
            return dict(_NO_GRAPHS)
        from vllm.config import CUDAGraphMode

        if dispatcher.cudagraph_mode == CUDAGraphMode.NONE:
            return dict(_NO_GRAPHS)
        full = [k for k in dispatcher.cudagraph_keys.get(CUDAGraphMode.FULL, set()) if getattr(k, "uniform", False)]
        piecewise = list(dispatcher.cudagraph_keys.get(CUDAGraphMode.PIECEWISE, set()))
        return {"capture_sizes": sorted(int(x) for x in capture_sizes), "decode_sizes": every_lora_case(full),
                "piecewise_sizes": every_lora_case(piecewise)}


class V2RunnerView(RunnerView):
    """vLLM's model runner V2 (``vllm/v1/worker/gpu/model_runner.py``), vLLM 0.26 and 0.32."""

    name = "V2"

    def __init__(self, runner: Any) -> None:
        super().__init__(runner)
        self._batch: Any = None  # the InputBatch prepare_inputs returned for the step being run
        self._manager_dispatch: Callable[..., Any] | None = None  # the manager's own dispatch, before wrapping

    def check_supported(self) -> None:
        runner = self.runner
        if getattr(runner, "pcp_manager", None) is not None:
            # prefill context parallelism partitions the batch's tokens across ranks after prepare_inputs: a
            # request's rows are then not one contiguous slice of what the layers see on this rank
            raise RuntimeError("deltaserve_vllm does not support prefill context parallelism on vLLM's V2 model "
                               "runner (a request's tokens are split across ranks)")
        if getattr(runner.vllm_config.parallel_config, "enable_dbo", False):
            # dual-batch overlap runs the forward as micro-batches: a layer would see part of the step only
            raise RuntimeError("deltaserve_vllm does not support dual-batch overlap (enable_dbo) on vLLM's V2 model "
                               "runner: the layers see micro-batches, not the step's token batch")

    @property
    def async_scheduling(self) -> bool:
        return bool(getattr(self.runner.vllm_config.scheduler_config, "async_scheduling", False))

    def engine_step(self, args: tuple, kwargs: dict) -> bool:
        return not kwargs.get("dummy_run", False)

    def begin_step(self) -> None:
        self._batch = None

    def sample_after_abort(self, original: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        # V2's sample_tokens answers None when it holds no execute_model_state, and the batch-queue loop reads a
        # None from sample_tokens as a failed execute_model ("unexpected error"): the aborted step's own output
        # is the answer (V1's runner returns an empty output itself in that case).
        return self.aborted_output()

    def _prepare_inputs(self, original: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        batch = original(*args, **kwargs)
        self._batch = batch
        return batch

    def rows(self, scheduler_output: Any, samples: Mapping[str, Any]) -> list[Row]:
        batch = self._batch
        if batch is None:
            raise RuntimeError("DeltaServe: vLLM's V2 model runner ran a forward without prepare_inputs for this "
                               "step; the fine-tuning rows cannot be located")
        return rows_at_offsets(batch.req_ids, batch.query_start_loc_np, batch.num_scheduled_tokens, samples)

    def dispatch(self, original: Callable[..., Any], no_graphs: bool, *args: Any, **kwargs: Any) -> tuple[Any, str]:
        desc = original(*args, **kwargs)
        if no_graphs and desc.cg_mode != _none_mode():
            asked = inspect.signature(original).bind(*args, **kwargs).arguments
            # What the manager returns when no captured graph matches: the step's own counts, unpadded.
            changes = {"cg_mode": _none_mode(), "num_tokens": asked["num_tokens"], "num_reqs": asked["num_reqs"],
                       "uniform_token_count": None}
            if any(f.name == "max_query_len" for f in dataclasses.fields(desc)):  # vLLM 0.32
                changes["max_query_len"] = None
            desc = dataclasses.replace(desc, **changes)
        return desc, str(desc.cg_mode)

    def install(self, execute: Callable[..., Any], sample: Callable[..., Any], dispatch: Callable[..., Any]) -> None:
        manager = self._graph_decider()
        if manager is not None:
            self._manager_dispatch = manager.dispatch
        super().install(execute, sample, dispatch)
        self.runner.prepare_inputs = functools.partial(self._prepare_inputs, self.runner.prepare_inputs)

    def _graph_decider(self) -> Any:
        return getattr(self.runner, "cudagraph_manager", None)

    def graph_sizes(self, capture_sizes: Sequence[int]) -> dict[str, list[int]]:
        manager = self._graph_decider()
        if manager is None or manager.cudagraph_mode == _none_mode():
            return dict(_NO_GRAPHS)
        from vllm.config import CUDAGraphMode

        dispatch = self._manager_dispatch or manager.dispatch
        query = int(getattr(self.runner, "decode_query_len", 1) or 1)
        extra = {"max_query_len": query} if "max_query_len" in inspect.signature(dispatch).parameters else {}
        decode, mixed = [], []
        for case in manager.lora_capture_cases:
            for size in capture_sizes:
                key = SimpleNamespace(num_tokens=int(size), has_lora=case > 0, num_active_loras=case)
                if size % query == 0:  # a uniform decode of size // query requests
                    desc = dispatch(size // query, size, query, case, **extra)
                    if desc.cg_mode == CUDAGraphMode.FULL and desc.num_tokens == size:
                        decode.append(key)
                desc = dispatch(1, size, None, case)  # a mixed batch (prefill) of size tokens
                if desc.cg_mode != CUDAGraphMode.NONE and desc.num_tokens == size:
                    mixed.append(key)
        sizes = sorted(int(x) for x in capture_sizes)
        if not decode and not mixed:
            return dict(_NO_GRAPHS)
        return {"capture_sizes": sizes, "decode_sizes": every_lora_case(decode),
                "piecewise_sizes": every_lora_case(mixed)}
