"""The worker extension's runner views (deltaserve_vllm.runner_view) without a GPU.

The V2 model runner itself only runs on CUDA, but its per-step ``InputBatch``, its batch order
(``sort_batch_req_ids``), its graph manager (``CudaGraphManager``: candidate table and ``dispatch``, with the parts
that need a GPU or a process group stubbed) and its runner class import and run on CPU. A stand-in runner subclasses
vLLM's real V2 class (so the view is chosen from the type, as on the GPU) and replays the order of calls V2's
``execute_model`` makes -- graph decision, ``prepare_inputs``, forward through the layers, ``sample_tokens`` -- with
vLLM's own helpers, so the worker's wrappers run exactly where they run on the GPU.
"""

from __future__ import annotations

import dataclasses
import importlib.util
import inspect
import os
from types import SimpleNamespace
from typing import Any

os.environ.setdefault("OMP_NUM_THREADS", "1")

import pytest
import torch

needs_vllm = pytest.mark.skipif(importlib.util.find_spec("vllm") is None, reason="vLLM is not installed")

FT = "__deltaserve_ft__"


def _sample(sample_id: int) -> Any:
    return SimpleNamespace(sample_id=sample_id)


# ------------------------------------------------------------------------------------ pure row logic


def test_rows_in_order_follow_the_persistent_batch() -> None:
    from deltaserve_vllm.runner_view import rows_in_order

    counts = {"a": 1, f"{FT}1-7": 5, "b": 3}
    # V1's input_batch may hold requests not scheduled this step and empty slots
    rows = rows_in_order(["b", None, "idle", f"{FT}1-7", "a"], counts, {f"{FT}1-7": _sample(7)})
    assert rows == [(7, 3, 5)]


def test_rows_at_offsets_follow_the_step_batch() -> None:
    import numpy as np

    from deltaserve_vllm.runner_view import rows_at_offsets

    rows = rows_at_offsets(["a", "b", f"{FT}1-7", f"{FT}1-8"], np.array([0, 1, 2, 6, 9]), np.array([1, 1, 4, 3]),
                           {f"{FT}1-7": _sample(7), f"{FT}1-8": _sample(8)})
    assert rows == [(7, 2, 4), (8, 6, 3)]


# ------------------------------------------------------------------------------------ against vLLM's V2 classes


def _v2_batch(num_scheduled_tokens: dict[str, int]) -> Any:
    """The InputBatch V2's prepare_inputs would build for these counts: vLLM's own order and dataclass."""
    import numpy as np
    from vllm.v1.worker.gpu.input_batch import InputBatch, InputBuffers
    from vllm.v1.worker.gpu.model_runner import sort_batch_req_ids

    params = inspect.signature(sort_batch_req_ids).parameters
    args = (num_scheduled_tokens, {}, 1) if "draft_tokens" in params else (num_scheduled_tokens, 1)  # 0.32 | 0.26
    req_ids = sort_batch_req_ids(*args)
    counts = np.array([num_scheduled_tokens[r] for r in req_ids], dtype=np.int32)
    starts = np.zeros(len(req_ids) + 1, dtype=np.int32)
    np.cumsum(counts, out=starts[1:])
    total = int(counts.sum())
    dummy = InputBatch.make_dummy(len(req_ids), total, InputBuffers(16, 64, torch.device("cpu")))
    return dataclasses.replace(dummy, req_ids=req_ids, num_scheduled_tokens=counts, query_start_loc_np=starts)


@pytest.fixture
def graph_manager(monkeypatch: pytest.MonkeyPatch) -> Any:
    """vLLM's own V2 CudaGraphManager (its __init__, candidate table and dispatch) for capture sizes 1-16, at most 8
    requests, FULL_AND_PIECEWISE and LoRA cases 0/1/2, marked captured; what needs a GPU or a process group is
    stubbed in its module."""
    from vllm.config import CUDAGraphMode
    from vllm.v1.worker.gpu import cudagraph_utils

    monkeypatch.setattr(cudagraph_utils, "get_pp_group", lambda: SimpleNamespace(is_first_rank=True,
                                                                                 is_last_rank=True))
    monkeypatch.setattr(cudagraph_utils, "current_platform", SimpleNamespace(get_global_graph_pool=lambda: None))
    monkeypatch.setattr(cudagraph_utils, "is_breakable_cudagraph_enabled", lambda: False)
    config = SimpleNamespace(
        scheduler_config=SimpleNamespace(max_num_seqs=8),
        compilation_config=SimpleNamespace(cudagraph_capture_sizes=[1, 2, 4, 8, 16], max_cudagraph_capture_size=16),
        parallel_config=SimpleNamespace(data_parallel_size=1, tensor_parallel_size=1), speculative_config=None,
        cache_config=SimpleNamespace(use_kda_recoverssm=False))  # read by 0.32's candidate table
    manager = cudagraph_utils.CudaGraphManager(config, torch.device("cpu"), CUDAGraphMode.FULL_AND_PIECEWISE,
                                               decode_query_len=1, lora_capture_cases=[0, 1, 2])
    manager._graphs_captured = True  # what capture() sets once the graphs exist
    return manager


def _v2_runner_class() -> type:
    """A stand-in for vLLM's V2 GPUModelRunner: a subclass of the real class whose execute_model / sample_tokens /
    prepare_inputs replay V2's call order on CPU, asking the graph manager it is given."""
    from vllm.config import CUDAGraphMode
    from vllm.v1.worker.gpu.model_runner import GPUModelRunner

    class Runner(GPUModelRunner):  # type: ignore[misc]
        def __init__(self, manager: Any = None, layers: int = 2) -> None:  # vLLM's __init__ needs a GPU
            self.cudagraph_manager = manager
            self.vllm_config = SimpleNamespace(scheduler_config=SimpleNamespace(async_scheduling=False),
                                               parallel_config=SimpleNamespace(enable_dbo=False))
            self.pcp_manager = None
            self.decode_query_len = 1
            self.layers = layers
            self.receiver: Any = None
            self.descs: list[Any] = []  # the graph descriptor each execute_model ran with
            self.execute_model_state: Any = None

        def prepare_inputs(self, scheduler_output: Any, batch_desc: Any) -> Any:
            return _v2_batch(scheduler_output.num_scheduled_tokens)

        def execute_model(self, scheduler_output: Any, intermediate_tensors: Any = None, dummy_run: bool = False,
                          **kwargs: Any) -> Any:
            counts = scheduler_output.num_scheduled_tokens
            n, total = len(counts), scheduler_output.total_num_scheduled_tokens
            uniform = 1 if total == n else None
            desc = self.cudagraph_manager.dispatch(n, total, uniform, num_active_loras=1)
            self.descs.append(desc)
            batch = self.prepare_inputs(scheduler_output, desc)
            if desc.cg_mode != CUDAGraphMode.FULL:  # a full graph replays without running any layer hook
                # row r of the flattened batch holds the value (index of its request in the batch) * 100 + r
                owner = torch.repeat_interleave(torch.arange(len(batch.req_ids)),
                                                torch.from_numpy(batch.num_scheduled_tokens).long())
                hidden = (owner * 100 + torch.arange(total)).float().unsqueeze(1)
                for layer in range(self.layers):
                    self.receiver(layer, hidden, None if layer == 0 else torch.zeros_like(hidden))
            self.execute_model_state = batch  # after the forward, as V2 does
            return None

        def sample_tokens(self, grammar_output: Any) -> Any:
            if self.execute_model_state is None:  # as V2: "the prior execute_model call must have failed"
                return None
            batch, self.execute_model_state = self.execute_model_state, None
            return SimpleNamespace(req_ids=list(batch.req_ids))

    return Runner


class _Sink:
    def __init__(self, abort: bool = False) -> None:
        self.abort = abort
        self.captured: dict[tuple[int, int], torch.Tensor] = {}
        self.ended: list[tuple[list[int], list[int]]] = []

    def begin_step(self, step_id: int, samples: Any) -> None:
        pass

    def layer_input(self, step_id: int, layer: int, sample_id: int, hidden: torch.Tensor) -> None:
        self.captured[(layer, sample_id)] = hidden.clone()

    def should_abort(self, step_id: int) -> bool:
        return self.abort

    def end_step(self, step_id: int, completed: Any, aborted: Any) -> None:
        self.ended.append((list(completed), list(aborted)))


def _attached(manager: Any, layers: int = 2) -> tuple[Any, Any, Any]:
    from deltaserve_vllm.channel import open_channel
    from deltaserve_vllm.worker import _WorkerState

    runner = _v2_runner_class()(manager, layers)
    channel = open_channel()
    state = _WorkerState(channel, runner, num_layers=layers)
    runner.receiver = state.on_layer
    state.view.install(state.execute, state.sample, state.dispatch)
    return runner, channel, state


def _output(counts: dict[str, int]) -> Any:
    return SimpleNamespace(num_scheduled_tokens=dict(counts), total_num_scheduled_tokens=sum(counts.values()))


@needs_vllm
def test_view_is_chosen_from_the_runner_type() -> None:
    from vllm.v1.worker.gpu_model_runner import GPUModelRunner as V1Runner

    from deltaserve_vllm.runner_view import V1RunnerView, V2RunnerView, is_v2_runner, view_for

    v2 = _v2_runner_class()()
    v1 = object.__new__(V1Runner)
    assert is_v2_runner(v2) and not is_v2_runner(v1) and not is_v2_runner(SimpleNamespace())
    assert isinstance(view_for(v2), V2RunnerView)
    assert isinstance(view_for(v1), V1RunnerView) and isinstance(view_for(SimpleNamespace()), V1RunnerView)


@needs_vllm
def test_v2_rows_follow_the_batch_the_runner_built(graph_manager: Any) -> None:
    """V2 sorts decodes before prefills: a fine-tuning prefill the scheduler listed first sits after the decodes,
    and its captured rows are exactly its tokens in the flattened batch."""
    from deltaserve_vllm.channel import StepPlan

    runner, channel, state = _attached(graph_manager)
    sink = channel.activation_sink = _Sink()
    ft_a, ft_b = f"{FT}4-11", f"{FT}4-12"
    counts = {ft_a: 5, "client-1": 1, ft_b: 3, "client-2": 1, "client-3": 2}
    out = _output(counts)
    channel.plans[id(out)] = StepPlan(step_id=4, samples={ft_a: _sample(11), ft_b: _sample(12)})
    assert runner.execute_model(out, None) is None
    runner.sample_tokens(None)
    batch = _v2_batch(counts)
    assert list(batch.req_ids[:2]) == ["client-1", "client-2"]  # vLLM's order, not the scheduler's
    for rid, sample_id in ((ft_a, 11), (ft_b, 12)):
        i = list(batch.req_ids).index(rid)
        start, n = int(batch.query_start_loc_np[i]), counts[rid]
        expected = (i * 100 + torch.arange(start, start + n)).float().unsqueeze(1)
        for layer in range(2):
            assert torch.equal(sink.captured[(layer, sample_id)], expected), (rid, layer)
    assert sink.ended == [([11, 12], [])]
    assert channel.timings[id(out)].mode.value == "eager"


@needs_vllm
def test_v2_step_with_finetune_rows_runs_without_graphs(graph_manager: Any) -> None:
    """vLLM's manager would replay the FULL decode graph of 4 for this shape; with a fine-tuning row it is asked the
    same and the runner gets the manager's no-graph descriptor for the step's own counts (unpadded), keeping its
    LoRA case. Inference-only steps keep the manager's choice."""
    from vllm.config import CUDAGraphMode

    from deltaserve_vllm.channel import StepPlan

    runner, channel, state = _attached(graph_manager)
    channel.activation_sink = _Sink()
    runner.execute_model(_output({"client-1": 1, "client-2": 1}), None)
    runner.sample_tokens(None)
    assert runner.descs[-1].cg_mode == CUDAGraphMode.FULL
    out = _output({"client-1": 1, f"{FT}5-1": 1, "client-2": 1})  # a uniform decode shape: FULL graph of 4
    channel.plans[id(out)] = StepPlan(step_id=5, samples={f"{FT}5-1": _sample(1)})
    runner.execute_model(out, None)
    runner.sample_tokens(None)
    desc = runner.descs[-1]
    assert desc.cg_mode == CUDAGraphMode.NONE and desc.num_tokens == 3 and desc.num_reqs == 3
    assert desc.uniform_token_count is None and desc.num_active_loras == 1
    assert state.step is None and channel.timings[id(out)].mode.value == "eager"
    # a step with fine-tuning rows but no plan (the worker could not find it) still runs without graphs
    bare = _output({"client-1": 1, f"{FT}6-1": 1})
    runner.execute_model(bare, None)
    runner.sample_tokens(None)
    assert runner.descs[-1].cg_mode == CUDAGraphMode.NONE


@needs_vllm
def test_v2_abort_stops_the_forward_and_returns_the_empty_output(graph_manager: Any) -> None:
    from vllm.v1.outputs import EMPTY_MODEL_RUNNER_OUTPUT

    from deltaserve_vllm.channel import StepPlan

    runner, channel, state = _attached(graph_manager)
    sink = channel.activation_sink = _Sink(abort=True)
    out = _output({f"{FT}7-1": 4})
    channel.plans[id(out)] = StepPlan(step_id=7, samples={f"{FT}7-1": _sample(1)}, ft_only=True)
    assert runner.execute_model(out, None) is EMPTY_MODEL_RUNNER_OUTPUT
    assert runner.execute_model_state is None  # the runner holds nothing for a sample_tokens that will not come
    assert sink.ended == [([], [1])] and not sink.captured
    timing = channel.timings[id(out)]
    assert timing.aborted and state.step is None
    # vLLM's batch-queue loop (async scheduling) samples every step, the aborted one too: V2's own sample_tokens
    # would answer None there, which that loop raises on; the aborted step's empty output is the answer instead
    assert runner.sample_tokens(None) is EMPTY_MODEL_RUNNER_OUTPUT
    # the synchronous loop does not sample an aborted step: the next step's sample_tokens is the runner's own
    sink.abort = False
    out = _output({f"{FT}8-1": 4})
    channel.plans[id(out)] = StepPlan(step_id=8, samples={f"{FT}8-1": _sample(1)}, ft_only=True)
    sink.abort = True
    runner.execute_model(out, None)
    sink.abort = False
    client = _output({"client-1": 3})
    assert runner.execute_model(client, None) is None
    assert runner.sample_tokens(None).req_ids == ["client-1"]
    assert not channel.timings[id(client)].aborted


@needs_vllm
def test_v2_dummy_runs_pass_through(graph_manager: Any) -> None:
    """V2's _dummy_run calls execute_model(dummy_run=True): no step, no timing, the graph decision untouched."""
    runner, channel, state = _attached(graph_manager)
    out = _output({"_dummy_req_0": 4})
    runner.execute_model(out, None, dummy_run=True)
    assert state.step is None and id(out) not in channel.timings


@needs_vllm
def test_v2_graph_sizes_are_read_from_the_manager(graph_manager: Any) -> None:
    runner, channel, state = _attached(graph_manager)
    sizes = state.view.graph_sizes([1, 2, 4, 8, 16])
    assert sizes == {"capture_sizes": [1, 2, 4, 8, 16], "decode_sizes": [1, 2, 4, 8],
                     "piecewise_sizes": [1, 2, 4, 8, 16]}
    from deltaserve_vllm.graphs import GraphSizes

    assert GraphSizes.from_worker(sizes).enabled


@needs_vllm
def test_v2_configurations_the_worker_cannot_follow_are_refused() -> None:
    from deltaserve_vllm.runner_view import V2RunnerView

    runner = _v2_runner_class()()
    V2RunnerView(runner).check_supported()
    runner.pcp_manager = object()
    with pytest.raises(RuntimeError, match="prefill context parallelism"):
        V2RunnerView(runner).check_supported()
    runner.pcp_manager = None
    runner.vllm_config.parallel_config.enable_dbo = True
    with pytest.raises(RuntimeError, match="dual-batch overlap"):
        V2RunnerView(runner).check_supported()


@needs_vllm
def test_v1_view_keeps_the_dispatcher_contract() -> None:
    from vllm.config import CUDAGraphMode

    from deltaserve_vllm.runner_view import V1RunnerView

    view = V1RunnerView(SimpleNamespace(input_batch=SimpleNamespace(req_ids=["x", f"{FT}1-2"])))
    seen: list[Any] = []

    def dispatcher(**kwargs: Any) -> tuple[Any, None]:
        seen.append(kwargs)
        return (CUDAGraphMode.NONE if kwargs.get("valid_modes") else CUDAGraphMode.FULL), None

    assert view.dispatch(dispatcher, False, num_tokens=4, invalid_modes={"x"})[1] == str(CUDAGraphMode.FULL)
    result, mode = view.dispatch(dispatcher, True, num_tokens=4, invalid_modes={"x"})
    assert mode == str(CUDAGraphMode.NONE) and seen[-1] == {"num_tokens": 4, "valid_modes": {CUDAGraphMode.NONE}}
    assert view.rows(_output({"x": 2, f"{FT}1-2": 3}), {f"{FT}1-2": _sample(2)}) == [(2, 2, 3)]


@needs_vllm
@pytest.mark.parametrize("v2", [False, True])
def test_injected_request_data_carries_what_the_runner_reads(v2: bool) -> None:
    """V2's add_requests builds a request's state from NewRequestData.prefill_token_ids (and asserts it is set), as
    vLLM's scheduler fills it when the V2 runner is in use; V1's request data stays as vLLM builds it."""
    from vllm.sampling_params import SamplingParams
    from vllm.v1.request import Request

    from deltaserve_vllm.scheduler import DeltaServeSchedulerMixin

    request = Request(request_id=f"{FT}3-9", prompt_token_ids=[5, 6, 7], sampling_params=SamplingParams(max_tokens=1),
                      pooling_params=None, lora_request=None)
    scheduler = SimpleNamespace(use_v2_model_runner=v2, model_uses_mrope=False)
    data = DeltaServeSchedulerMixin._new_request_data(scheduler, request, ([1],))  # type: ignore[arg-type]
    assert data.prompt_token_ids == [5, 6, 7] and data.num_computed_tokens == 0 and data.block_ids == ([1],)
    assert data.prefill_token_ids == ([5, 6, 7] if v2 else None)
