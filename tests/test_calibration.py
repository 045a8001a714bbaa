"""Calibration: the sweep's shapes, the fit through a test-double host, and the profile store."""

from __future__ import annotations

import dataclasses
import hashlib
import json
import random
from collections import Counter

import pytest

from deltaserve_core.calibration import (
    CalibrationError,
    CalibrationProfile,
    ProfileKey,
    ProfileStore,
    build_sweep,
    calibrate,
    format_quality,
    load_or_calibrate,
)
from deltaserve_core.latency_model import Equation, eq1_time, eq2_time, prefill_features
from deltaserve_core.types import ExecutionMode, HostCapabilities, ModelSpec, ProfileShape, StepRecord

G, E = ExecutionMode.GRAPH, ExecutionMode.EAGER
BOTH = frozenset({G, E})

# Equation I as (α, β, γ, ε, c, δ, ζ, η), Equation II as (β′, ε′, c′). Eager has co-serving terms ζ, η (a host
# that runs the LoRA path over the whole batch once a fine-tuning row is in it, as vLLM does).
TRUE = {
    G: ((2e-8, 5e-5, 0.0, 2e-8, 0.004, 1e-4, 0.0, 0.0), (5e-5, 2e-8, 0.006)),
    E: ((2.4e-8, 6e-5, 2e-5, 2.4e-8, 0.02, 3e-4, 4e-5, 3e-3), (6e-5, 2.4e-8, 0.02)),
}


class FakeHost:
    """A test double: step durations follow TRUE's coefficients, with optional noise and stragglers."""

    name = "fake"

    def __init__(self, modes=BOTH, mixed=True, noise=0.0, stragglers=0.0, seed=0, fail_on=None,
                 engine_version="1.2.3", true=None):
        self.caps = HostCapabilities(engine="fake", engine_version=engine_version, graph_modes=modes,
                                     mixed_batches=mixed, max_finetune_tokens_per_step=2048)
        self.rng = random.Random(seed)
        self.noise, self.stragglers, self.fail_on = noise, stragglers, fail_on
        self.true = TRUE if true is None else true
        self.calls: list[ProfileShape] = []

    def capabilities(self) -> HostCapabilities:
        return self.caps

    def model_spec(self) -> ModelSpec:
        return ModelSpec(path="/models/tiny-llama", architecture="LlamaForCausalLM", num_layers=2, hidden_size=64,
                         vocab_size=128, dtype="float32")

    def run_profile_step(self, shape: ProfileShape) -> StepRecord:
        self.calls.append(shape)
        if self.fail_on is not None and len(self.calls) == self.fail_on:
            raise RuntimeError("device lost")
        kv = shape.num_decode * shape.decode_context
        p, d = self.true[shape.mode]
        if shape.prefill_lengths or shape.finetune_lengths:
            y = eq1_time(p, *prefill_features(shape.prefill_lengths, shape.num_decode, kv, shape.finetune_lengths))
        else:
            y = eq2_time(d, shape.num_decode, kv)
        y *= 1 + self.rng.gauss(0, self.noise)
        if self.rng.random() < self.stragglers:
            y *= 3
        return StepRecord(step_id=len(self.calls), start_time=0.0, duration_s=y, mode=shape.mode,
                          prefill_lengths=shape.prefill_lengths, num_decode=shape.num_decode, kv_tokens=kv,
                          finetune_lengths=shape.finetune_lengths, synthetic=True)


def sweep_for(host: FakeHost, **kw):
    return build_sweep(host.capabilities(), 2048, 64, 65536, 4096, **kw)


# ---------------------------------------------------------------------------------------------- the sweep


def test_sweep_has_the_paper_families_for_each_mode():
    sweep = sweep_for(FakeHost())
    families = Counter((s.mode, s.tags[0]) for s in sweep)
    for mode in (G, E):
        for tag in ("prefill_length", "prefill_split", "decode_grid", "mixed", "rows"):
            assert families[(mode, tag)] >= 4, (mode, tag)
    assert families[(E, "finetune")] >= 10 and families[(G, "finetune")] == 0
    assert all(not s.finetune_lengths or s.mode is E for s in sweep)  # FT-carrying shapes only eager
    assert all(s.prefill_lengths or s.num_decode or s.finetune_lengths for s in sweep)  # no empty steps


def test_sweep_respects_limits():
    host = FakeHost()
    sweep = build_sweep(host.capabilities(), 1024, 32, 8192, 4096)
    ft_totals = {sum(s.finetune_lengths) for s in sweep if s.finetune_lengths}
    assert max(ft_totals) <= host.capabilities().max_finetune_tokens_per_step  # capped by the host
    assert 0 in {sum(s.finetune_lengths) for s in sweep if "finetune" in s.tags}  # the 0 end of 0..S
    for s in sweep:
        assert sum(s.prefill_lengths) + sum(s.finetune_lengths) <= 1024
        assert s.num_decode <= 32 and s.num_decode * s.decode_context <= 8192
        assert all(n >= 2 for n in s.finetune_lengths) and all(n >= 1 for n in s.prefill_lengths)
    splits = [s for s in sweep if "prefill_split" in s.tags and s.mode is E]
    by_total = Counter(sum(s.prefill_lengths) for s in splits)
    assert max(by_total.values()) >= 4  # one total split across 1..k requests
    assert max(len(s.prefill_lengths) for s in splits) == 16
    assert len({(s.prefill_lengths, s.num_decode, s.decode_context, s.finetune_lengths, s.mode) for s in sweep}) \
        == len(sweep)


def test_sweep_rows_family_isolates_the_row_count():
    """δ's family: many short prompts, and (mixed hosts) prompt+decodes paired with a lone prompt of the same
    Σ(n+B_d)² and T_in+B_d, so the pair differs only in R (and a little KV)."""
    sweep = sweep_for(FakeHost())
    rows = [s for s in sweep if s.tags == ("rows",) and s.mode is E]
    short = [s for s in rows if not s.num_decode and len(s.prefill_lengths) > 1]
    assert max(len(s.prefill_lengths) for s in short) == 64  # max(max_split, max_decode_batch)
    assert all(set(s.prefill_lengths) == {16} for s in short)
    keys = {(s.prefill_lengths, s.num_decode) for s in sweep if s.mode is E}
    with_decodes = [s for s in rows if s.num_decode]
    assert len(with_decodes) >= 4
    for s in with_decodes:
        twin = (s.prefill_lengths[0] + s.num_decode,)
        assert (twin, 0) in keys, s  # its single-row twin (possibly tagged by another family)
        assert prefill_features(s.prefill_lengths, s.num_decode, 0)[:2] == prefill_features(twin, 0, 0)[:2]
    small = build_sweep(FakeHost(mixed=False).capabilities(), 64, 8, 1024, 64, max_rows=100)
    assert max(len(s.prefill_lengths) for s in small if s.tags == ("rows",)) == 4  # 4 x 16 tokens fit in 64
    assert not [s for s in small if s.prefill_lengths and s.num_decode]
    with pytest.raises(ValueError, match="max_rows"):
        build_sweep(FakeHost().capabilities(), 64, 8, 1024, 64, max_rows=0)


def test_sweep_without_mixed_batches_or_eager():
    sweep = sweep_for(FakeHost(mixed=False))
    assert not [s for s in sweep if s.prefill_lengths and s.num_decode]
    graph_only = sweep_for(FakeHost(modes=frozenset({G})))
    assert {s.mode for s in graph_only} == {G} and not any(s.finetune_lengths for s in graph_only)


def test_sweep_rejects_bad_limits():
    caps = FakeHost().capabilities()
    with pytest.raises(ValueError, match="max_decode_batch"):
        build_sweep(caps, 1024, 0, 100, 10)
    with pytest.raises(ValueError, match="max_ft_tokens"):
        build_sweep(caps, 1024, 4, 100, -1)


# ------------------------------------------------------------------------------------------------ calibrate


def test_calibrate_recovers_coefficients_through_the_host():
    host = FakeHost(stragglers=0.03, seed=1)
    sweep = sweep_for(host)
    profile = calibrate(host, sweep, progress=False, warmup=2)
    assert len(host.calls) == 2 * len(sweep) + 2 * 2  # each shape warmed once + two warm-up steps per mode, unrecorded
    assert len(profile.records) == len(sweep)
    for mode, (p, d) in TRUE.items():
        got_p = profile.model.eq1_coefficients(mode)
        got_d = profile.model.eq2_coefficients(mode)
        assert len(got_p) == len(p) == 8  # δ, ζ and η are fitted and recovered with the rest
        for want, got in zip(p + d, got_p + got_d):
            assert got == pytest.approx(want, rel=0.01, abs=1e-15)
    assert set(profile.quality) == {G, E}
    assert sum(q.dropped for q in profile.quality.values()) >= 1  # stragglers were trimmed
    table = format_quality(profile)
    assert "graph" in table and "eager" in table and "MAPE" in table


def test_calibrate_with_noise_reports_quality():
    host = FakeHost(noise=0.01, seed=2)
    profile = calibrate(host, sweep_for(host, repeats=2), progress=False)
    assert len(profile.records) == 2 * len(sweep_for(host))
    for q in profile.quality.values():
        assert 0.002 < q.mape < 0.02 and q.p95_ape < 0.04


@pytest.mark.parametrize("mixed", [True, False])
def test_sweep_identifies_delta_under_noise(mixed):
    """With 1 % timing noise the sweep still pins δ (and the other Equation I coefficients carrying real
    time): the rows family gives R its own lever, on mixed and non-mixed hosts alike."""
    host = FakeHost(mixed=mixed, noise=0.01, seed=4)
    profile = calibrate(host, sweep_for(host, repeats=3), progress=False)
    for mode, (p, _) in TRUE.items():
        got = profile.model.eq1_coefficients(mode)
        assert got[5] == pytest.approx(p[5], rel=0.1), (mode, got)
        for i in (0, 1, 4):  # α, β, c
            assert got[i] == pytest.approx(p[i], rel=0.1), (mode, i, got)
    # the co-serving terms are identified by the finetune family's prompts of two lengths
    got = profile.model.eq1_coefficients(E)
    for i in (6, 7):
        assert got[i] == pytest.approx(TRUE[E][0][i], rel=0.15), (i, got)


def test_host_without_row_cost_fits_delta_near_zero():
    flat = {m: (p[:5] + (0.0, 0.0, 0.0), d) for m, (p, d) in TRUE.items()}
    host = FakeHost(true=flat)
    profile = calibrate(host, sweep_for(host), progress=False)
    for mode, (p, _) in flat.items():
        got = profile.model.eq1_coefficients(mode)
        assert got[5] <= 1e-9 * p[4] and got[7] <= 1e-9 * p[4] and got[6] <= 1e-9 * p[1]
        for want, g in zip(p[:5], got[:5]):
            assert g == pytest.approx(want, rel=0.01, abs=1e-15)


def test_calibrate_progress_bar(capsys):
    host = FakeHost()
    calibrate(host, sweep_for(host, points=3), progress=True)
    assert "calibrating fake" in capsys.readouterr().err


def test_calibrate_names_the_failing_shape():
    host = FakeHost(fail_on=5)
    with pytest.raises(CalibrationError, match=r"host 'fake'.*profiling step .*device lost"):
        calibrate(host, sweep_for(host), progress=False)


def test_calibrate_refuses_empty_sweep_and_unfittable_modes():
    host = FakeHost()
    with pytest.raises(CalibrationError, match="empty"):
        calibrate(host, [], progress=False)
    few = [ProfileShape(prefill_lengths=(16,), mode=E)] * 3
    with pytest.raises(CalibrationError, match="without coefficients"):
        calibrate(host, few, progress=False, warmup=0)


# ---------------------------------------------------------------------------------------------- the store


def test_store_round_trip_is_atomic_and_exact(tmp_path):
    host = FakeHost(noise=0.005, seed=3)
    profile = calibrate(host, sweep_for(host, points=4), progress=False)
    store = ProfileStore(tmp_path / "profiles")
    path = store.save(profile)
    assert path.exists() and [p.name for p in path.parent.iterdir()] == [path.name]  # no temp file left
    json.loads(path.read_text())  # strict JSON
    loaded = store.load(profile.key)
    assert isinstance(loaded, CalibrationProfile) and loaded.key == profile.key
    for mode in (G, E):
        for eq in Equation:
            assert loaded.model.coefficients(mode, eq) == profile.model.coefficients(mode, eq)
    assert loaded.quality == profile.quality
    assert [r.duration_s for r in loaded.records] == [r.duration_s for r in profile.records]
    # the loaded model keeps the calibration records as anchors for online refits
    loaded.model.refit()
    assert loaded.model.predict((512,), 4, 2000, (128,), E) == pytest.approx(
        profile.model.predict((512,), 4, 2000, (128,), E), rel=1e-6)


def test_store_keys_and_misses(tmp_path):
    store = ProfileStore(tmp_path)
    host = FakeHost()
    key = ProfileKey.for_host(host)
    assert key == ProfileKey("fake", "1.2.3", "/models/tiny-llama", "cpu", "float32")
    assert store.load(key) is None
    other = ProfileKey("fake", "1.2.4", "/models/tiny-llama", "cpu", "float32")
    assert store.path_for(key) != store.path_for(other)
    store.path_for(key).write_text("{not json")
    with pytest.warns(RuntimeWarning, match="unusable"):
        assert store.load(key) is None
    # a timing variant (vLLM's async scheduling) gets its own profile; no variant keeps the name profiles had
    # before variants existed (the hash of the five original fields)
    variant = dataclasses.replace(key, variant="async")
    assert store.path_for(variant) != store.path_for(key) and "async" in store.path_for(variant).name
    legacy = hashlib.sha256(json.dumps({"host": "fake", "engine_version": "1.2.3", "model": "/models/tiny-llama",
                                        "device": "cpu", "dtype": "float32"}, sort_keys=True).encode()).hexdigest()
    assert store.path_for(key).name.endswith(f"-{legacy[:16]}.json")


def test_load_or_calibrate_reuses_matching_profiles(tmp_path):
    store = ProfileStore(tmp_path)
    host = FakeHost()
    first = load_or_calibrate(host, store, progress=False, max_prefill_tokens=512, max_decode_batch=8, max_kv=4096)
    calls = len(host.calls)
    again = load_or_calibrate(host, store, progress=False)
    assert len(host.calls) == calls and again.key == first.key  # reused, no new steps
    assert store.keys() == [first.key]
    load_or_calibrate(host, store, progress=False, force=True, max_prefill_tokens=512, max_decode_batch=8,
                      max_kv=4096)
    assert len(host.calls) > calls
    # a profile stored before Equation I had δ (format version 1) is refused with a warning and recalibrated
    path = store.path_for(first.key)
    old = json.loads(path.read_text())
    old["version"] = 1
    old["model"]["version"] = 1
    for eqs in old["model"]["fits"].values():
        eqs["prefill"]["coefficients"].pop("delta")
    path.write_text(json.dumps(old))
    calls = len(host.calls)
    with pytest.warns(RuntimeWarning, match="version 1.*recalibrate"):
        fresh = load_or_calibrate(host, store, progress=False, max_prefill_tokens=512, max_decode_batch=8,
                                  max_kv=4096)
    assert len(host.calls) > calls and fresh.model.eq1_coefficients(E)[5] == pytest.approx(TRUE[E][0][5], rel=0.01)
    assert json.loads(path.read_text())["version"] == 2  # the recalibrated profile replaced the old file
    upgraded = FakeHost(engine_version="2.0")
    load_or_calibrate(upgraded, store, progress=False, max_prefill_tokens=512, max_decode_batch=8, max_kv=4096)
    assert upgraded.calls  # a new engine version is a different key: recalibrated
    assert store.delete(first.key) and not store.delete(first.key)
