"""Latency model: Equations I/II by hand (Equation I with its per-row term δ·R), NNLS recovery of known
coefficients, online refit, fallbacks, JSON."""

from __future__ import annotations

import json
import math
import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from deltaserve_core.latency_model import (
    DecodeCoefficients,
    Equation,
    LatencyModel,
    LatencyModelNotFitted,
    PrefillCoefficients,
    eq1_time,
    eq2_time,
    prefill_features,
)
from deltaserve_core.types import ExecutionMode, ProposedBatch, ScheduledRequest, StepRecord

G, E = ExecutionMode.GRAPH, ExecutionMode.EAGER

P_GRAPH = PrefillCoefficients(alpha=2e-8, beta=5e-5, gamma=0.0, eps=2e-8, c=0.004, delta=1e-4)
D_GRAPH = DecodeCoefficients(beta=5e-5, eps=2e-8, c=0.006)
# ζ, η: the co-serving terms (the LoRA path over the whole batch once a fine-tuning row is in it)
P_EAGER = PrefillCoefficients(alpha=2.4e-8, beta=6e-5, gamma=2e-5, eps=2.4e-8, c=0.02, delta=3e-4, zeta=3e-5,
                              eta=2e-3)
D_EAGER = DecodeCoefficients(beta=6e-5, eps=2.4e-8, c=0.02)
TRUE = {G: (P_GRAPH, D_GRAPH), E: (P_EAGER, D_EAGER)}


def true_time(mode, prefill, bd, kv, ft):
    p, d = TRUE[mode]
    if prefill or ft:
        return eq1_time(p.as_tuple(), *prefill_features(prefill, bd, kv, ft))
    return eq2_time(d.as_tuple(), bd, kv)


def synthetic_records(rng: random.Random, n: int = 240, noise: float = 0.0, outliers: float = 0.0,
                      truth=true_time) -> list[StepRecord]:
    """Varied shapes in both modes and both equations; FT rows only in eager steps (as on a real host)."""
    out = []
    for i in range(n):
        mode = G if i % 2 else E
        kind = i % 6
        prefill: tuple[int, ...] = ()
        ft: tuple[int, ...] = ()
        bd = kv = 0
        if kind in (0, 1):  # decode-only
            bd = rng.randint(1, 128)
            kv = bd * rng.randint(16, 2048)
        elif kind in (2, 3):  # prefill, sometimes split, sometimes with decodes
            total = rng.choice([64, 256, 1024, 2048])
            k = rng.choice([1, 2, 4, 8])
            prefill = tuple([total // k] * k)
            if rng.random() < 0.5:
                bd = rng.randint(1, 32)
                kv = bd * rng.randint(16, 1024)
        else:  # fine-tuning rows (eager) or plain prefill (graph)
            prefill = (rng.choice([0, 128, 512]),) if rng.random() < 0.7 else ()
            prefill = tuple(x for x in prefill if x)
            if mode is E:
                ft = tuple(rng.choice([64, 256, 512]) for _ in range(rng.randint(1, 6)))
            else:
                prefill = prefill or (rng.randint(16, 2048),)
            if rng.random() < 0.3:
                bd = rng.randint(1, 16)
                kv = bd * rng.randint(16, 1024)
        y = truth(mode, prefill, bd, kv, ft) * (1 + rng.gauss(0, noise))
        if rng.random() < outliers:
            y *= rng.choice([3.0, 0.3])
        out.append(StepRecord(step_id=i, start_time=0.0, duration_s=y, mode=mode, prefill_lengths=prefill,
                              num_decode=bd, kv_tokens=kv, finetune_lengths=ft))
    return out


def assert_coefficients_close(model: LatencyModel, rel: float = 0.01) -> None:
    for mode, (p, d) in TRUE.items():
        got_p = model.coefficients(mode, Equation.PREFILL)
        got_d = model.coefficients(mode, Equation.DECODE)
        for want, got in ((p, got_p), (d, got_d)):
            for w, g in zip(want.as_tuple(), got.as_tuple()):
                assert g == pytest.approx(w, rel=rel, abs=1e-12), (mode, want, got)


def hand_model() -> LatencyModel:
    m = LatencyModel()
    m.set_coefficients(G, prefill=P_GRAPH, decode=D_GRAPH)
    m.set_coefficients(E, prefill=P_EAGER, decode=D_EAGER)
    return m


# ------------------------------------------------------------------------------------------------ equations


def test_equation_one_by_hand_with_finetune_rows_as_prefill_rows():
    m = hand_model()
    a, b, g, e, c, d, z, h = P_EAGER.as_tuple()
    # prompts 100 and 50, 2 decodes reading 300 KV tokens, one 30-token FT sample: R = 2 + 2 + 1 rows, and the
    # co-serving terms over the U = 100 + 50 + 2 inference tokens
    want = (a * ((100 + 2) ** 2 + (50 + 2) ** 2 + (30 + 2) ** 2) + b * (100 + 50 + 30 + 2) + g * 30 + e * 300
            + d * 5 + c + z * 152 + h)
    assert m.predict((100, 50), 2, 300, (30,), E) == pytest.approx(want, rel=1e-12)
    # without the FT sample the co-serving terms vanish
    assert m.predict((100, 50), 2, 300, (), E) == pytest.approx(
        a * ((100 + 2) ** 2 + (50 + 2) ** 2) + b * (100 + 50 + 2) + e * 300 + d * 4 + c, rel=1e-12)
    # an FT-only step is Equation I too (one row, U = 0: only η of the co-serving terms)
    assert m.predict((), 0, 0, (40,), E) == pytest.approx(a * 40 * 40 + b * 40 + g * 40 + d + c + h, rel=1e-12)


def test_row_term_and_backward_compatible_forms():
    """δ is the trailing field: the paper's positional 5-coefficient form still builds Equation I with δ = 0,
    and eq1_time accepts both the 5-tuple and 4 features (the pre-δ call forms)."""
    p5 = PrefillCoefficients(2e-8, 5e-5, 1e-5, 2e-8, 0.004)
    assert p5.delta == 0.0 and p5.as_tuple() == (2e-8, 5e-5, 1e-5, 2e-8, 0.004, 0.0, 0.0, 0.0)
    feats = prefill_features((10, 20), 3, 90, (7, 8, 9))
    assert feats == ((13**2 + 23**2 + 10**2 + 11**2 + 12**2), 10 + 20 + 7 + 8 + 9 + 3, 24, 90, 2 + 3 + 3)
    assert eq1_time(p5.as_tuple()[:5], *feats) == eq1_time(p5.as_tuple(), *feats) == eq1_time(p5.as_tuple(), *feats[:4])
    with_rows = PrefillCoefficients(2e-8, 5e-5, 1e-5, 2e-8, 0.004, delta=1e-3)
    assert eq1_time(with_rows.as_tuple(), *feats) == pytest.approx(eq1_time(p5.as_tuple(), *feats) + 8e-3, rel=1e-12)
    with pytest.raises(ValueError, match="delta"):
        PrefillCoefficients(0, 0, 0, 0, 0, delta=-1e-6)


def test_equation_two_by_hand():
    m = hand_model()
    b, e, c = D_GRAPH.as_tuple()
    assert m.predict((), 8, 4000, (), G) == pytest.approx(b * 8 + e * 4000 + c, rel=1e-12)


def test_predict_batch_matches_predict_and_picks_mode():
    m = hand_model()
    batch = ProposedBatch(step_id=1, now=10.0, mode=G, scheduled=(
        ScheduledRequest("a", 9.0, prefill_tokens=100),
        ScheduledRequest("b", 1.0, context_tokens=700, first_token_time=2.0, last_token_time=9.9),
        ScheduledRequest("c", 1.0, context_tokens=300, first_token_time=2.0, last_token_time=9.9),
    ))
    assert m.predict_batch(batch) == m.predict((100,), 2, 1000, (), G)  # host's own mode without FT
    assert m.predict_batch(batch, (64, 32)) == m.predict((100,), 2, 1000, (64, 32), E)  # FT forces eager
    assert m.predict_batch(batch, (64,), mode=G) == m.predict((100,), 2, 1000, (64,), G)


def test_negative_coefficients_refused():
    with pytest.raises(ValueError, match="alpha"):
        PrefillCoefficients(alpha=-1.0, beta=0, gamma=0, eps=0, c=0)
    with pytest.raises(ValueError, match="c must be"):
        DecodeCoefficients(beta=1.0, eps=0.0, c=math.nan)


# ------------------------------------------------------------------------------------------------- fitting


@settings(max_examples=15, deadline=None)
@given(scale=st.lists(st.floats(0.2, 5.0), min_size=11, max_size=11), seed=st.integers(0, 2**16))
def test_fit_recovers_known_coefficients_within_one_percent(scale, seed):
    """Noise-free records from random (positive) coefficients: NNLS recovers every one, δ, ζ and η included,
    within 1 %."""
    p = PrefillCoefficients(alpha=2e-8 * scale[0], beta=5e-5 * scale[1], gamma=2e-5 * scale[2],
                            eps=2e-8 * scale[3], c=0.01 * scale[4], delta=2e-4 * scale[8],
                            zeta=3e-5 * scale[9], eta=2e-3 * scale[10])
    d = DecodeCoefficients(beta=5e-5 * scale[5], eps=2e-8 * scale[6], c=0.01 * scale[7])

    def truth(mode, prefill, bd, kv, ft):
        if prefill or ft:
            return eq1_time(p.as_tuple(), *prefill_features(prefill, bd, kv, ft))
        return eq2_time(d.as_tuple(), bd, kv)

    m = LatencyModel()
    m.fit(synthetic_records(random.Random(seed), n=120, truth=truth))
    for got, want in ((m.coefficients(E, Equation.PREFILL), p), (m.coefficients(E, Equation.DECODE), d),
                      (m.coefficients(G, Equation.DECODE), d)):
        for g_, w in zip(got.as_tuple(), want.as_tuple()):
            assert g_ == pytest.approx(w, rel=0.01)
    graph_p = m.coefficients(G, Equation.PREFILL)  # graph steps never carry FT: γ, ζ, η stay 0 there
    assert graph_p.gamma == graph_p.zeta == graph_p.eta == 0.0
    assert graph_p.alpha == pytest.approx(p.alpha, rel=0.01) and graph_p.c == pytest.approx(p.c, rel=0.01)
    assert graph_p.delta == pytest.approx(p.delta, rel=0.01)


def test_fit_without_a_row_cost_keeps_delta_near_zero():
    """An engine with one varlen attention kernel has no per-row cost: NNLS fits δ ≈ 0 (it cannot go
    negative) and Equation I is the paper's."""
    flat = {mode: (PrefillCoefficients(*p.as_tuple()[:5]), d) for mode, (p, d) in TRUE.items()}

    def truth(mode, prefill, bd, kv, ft):
        p, d = flat[mode]
        if prefill or ft:
            return eq1_time(p.as_tuple(), *prefill_features(prefill, bd, kv, ft))
        return eq2_time(d.as_tuple(), bd, kv)

    m = LatencyModel()
    m.fit(synthetic_records(random.Random(21), n=240, truth=truth))
    for mode, (p, _) in flat.items():
        got = m.coefficients(mode, Equation.PREFILL)
        assert got.delta <= 1e-9 * p.c  # numerically zero next to a step's constant cost
        assert got.zeta <= 1e-9 * p.beta and got.eta <= 1e-9 * p.c  # per-row LoRA: no co-serving terms
        for name in ("alpha", "beta", "gamma", "eps", "c"):
            assert getattr(got, name) == pytest.approx(getattr(p, name), rel=0.01, abs=1e-12)


def test_fit_trims_outliers():
    """5 % of steps 3x slower or faster (stragglers, clock glitches) do not move the fit."""
    m = LatencyModel()
    quality = m.fit(synthetic_records(random.Random(1), n=400, outliers=0.05))
    assert_coefficients_close(m, rel=0.01)
    assert sum(q.dropped for q in quality.values()) >= 10


def test_fit_with_small_noise():
    """0.1 % timing noise: the coefficients that carry most of a step's time stay within 1 % (ε of Equation I,
    a sliver of these steps, is only weakly identified by noisy data) and predictions stay at the noise level."""
    m = LatencyModel()
    quality = m.fit(synthetic_records(random.Random(2), n=1200, noise=0.001))
    for mode, (p, d) in TRUE.items():
        got_p = m.coefficients(mode, Equation.PREFILL)
        got_d = m.coefficients(mode, Equation.DECODE)
        for name in ("alpha", "beta", "c"):
            assert getattr(got_p, name) == pytest.approx(getattr(p, name), rel=0.01)
        for name in ("beta", "eps", "c"):
            assert getattr(got_d, name) == pytest.approx(getattr(d, name), rel=0.01)
    assert m.coefficients(E, Equation.PREFILL).gamma == pytest.approx(P_EAGER.gamma, rel=0.01)
    for q in quality.values():
        assert q.mape < 0.002 and q.p95_ape < 0.004
    for q in m.evaluate(synthetic_records(random.Random(3), n=200)).values():  # noise-free held-out truth
        assert q.mape < 0.001


def test_quality_report_on_held_out_records():
    m = LatencyModel()
    m.fit(synthetic_records(random.Random(3), n=300, noise=0.01))
    held_out = m.evaluate(synthetic_records(random.Random(4), n=200, noise=0.01))
    assert set(held_out) == {G, E}
    for q in held_out.values():
        assert q.n == 100 and 0.003 < q.mape < 0.02 and q.p95_ape < 0.04 and q.dropped == 0


def test_unusable_records_are_skipped():
    m = LatencyModel()
    good = synthetic_records(random.Random(5), n=60)
    bad = [
        StepRecord(1000, 0.0, 0.0, E, (10,)),  # zero duration
        StepRecord(1001, 0.0, -1.0, E, (10,)),
        StepRecord(1002, 0.0, math.inf, E, (10,)),
        StepRecord(1003, 0.0, 0.001, E, (), finetune_lengths=(64,), aborted_sample_ids=(3,)),  # stopped early
    ]
    m.fit(good + bad)
    assert m.skipped_records == 4
    assert not m.observe(bad[0])
    assert m.skipped_records == 5


def test_online_refit_tracks_drift():
    """After calibration the device slows by 40 %; the rolling window refits and follows it."""
    m = LatencyModel(window=600, refit_every=100)
    m.fit(synthetic_records(random.Random(6), n=120))
    slower = synthetic_records(random.Random(7), n=1200,
                               truth=lambda *a: 1.4 * true_time(*a))
    refits = sum(m.observe(r) for r in slower)
    assert refits >= 8
    for r in synthetic_records(random.Random(8), n=40):
        want = 1.4 * true_time(r.mode, r.prefill_lengths, r.num_decode, r.kv_tokens, r.finetune_lengths)
        got = m.predict(r.prefill_lengths, r.num_decode, r.kv_tokens, r.finetune_lengths, r.mode)
        assert got == pytest.approx(want, rel=0.02)


def test_refit_every_zero_only_refits_on_request():
    m = LatencyModel(refit_every=0)
    m.fit(synthetic_records(random.Random(9), n=120))
    before = m.predict((512,), 0, 0, (), E)
    assert not any(m.observe(r) for r in synthetic_records(random.Random(10), n=200,
                                                             truth=lambda *a: 2 * true_time(*a)))
    assert m.predict((512,), 0, 0, (), E) == before
    m.refit()
    assert m.predict((512,), 0, 0, (), E) == pytest.approx(2 * before, rel=0.1)


# ----------------------------------------------------------------------------------------------- fallbacks


def test_fallbacks_are_explicit():
    m = LatencyModel()
    assert not m.is_ready
    with pytest.raises(LatencyModelNotFitted, match="calibrat"):
        m.predict((10,), 0, 0, (), E)
    m.set_coefficients(E, prefill=P_EAGER)
    assert m.is_ready
    # graph borrows eager (over-estimates: safe), decode uses Equation I without prefill rows
    assert m.source(G, Equation.PREFILL).startswith("fallback:eager")
    assert m.source(E, Equation.DECODE).startswith("fallback:prefill")
    assert m.predict((100,), 0, 0, (), G) == m.predict((100,), 0, 0, (), E)
    _, b, _, e, c, d, _, _ = P_EAGER.as_tuple()
    assert m.predict((), 4, 100, (), E) == pytest.approx((b + d) * 4 + e * 100 + c)  # 4 decode rows
    m.set_coefficients(G, decode=D_GRAPH)
    assert m.source(E, Equation.DECODE).startswith("fallback:graph")
    assert m.source(G, Equation.DECODE) == "set"


def test_eager_borrowing_graph_warns():
    records = [r for r in synthetic_records(random.Random(11), n=120) if r.mode is G]
    with pytest.warns(RuntimeWarning, match="eager"):
        LatencyModel().fit(records)


def test_min_prefill_time_is_a_lower_bound_over_modes():
    m = hand_model()
    for n in (1, 17, 512, 4096):
        assert m.min_prefill_time(n) <= min(m.predict((n,), 0, 0, (), mode) for mode in (G, E)) + 1e-15
    # the one row of the request's own prefill step is part of the floor (δ folded into the constant)
    a, b, c = m.prefill_floor_coefficients()
    assert c == pytest.approx(min(P_GRAPH.c, P_EAGER.c) + min(P_GRAPH.delta, P_EAGER.delta))
    assert m.min_prefill_time(100) == pytest.approx(a * 100**2 + b * 100 + c)


# --------------------------------------------------------------------------------------------- persistence


def test_json_round_trip():
    m = LatencyModel(window=100, refit_every=10)
    m.fit(synthetic_records(random.Random(12), n=120, noise=0.01))
    m.set_coefficients(G, decode=D_GRAPH)
    data = json.loads(json.dumps(m.to_dict(), allow_nan=False))
    back = LatencyModel.from_dict(data)
    assert back.window == 100 and back.refit_every == 10
    for mode in (G, E):
        for eq in Equation:
            assert back.coefficients(mode, eq) == m.coefficients(mode, eq)
            assert back.source(mode, eq) == m.source(mode, eq)
            assert back.equation_quality(mode, eq) == m.equation_quality(mode, eq) or \
                math.isnan(m.equation_quality(mode, eq).mape)
    with pytest.raises(ValueError, match="format"):
        LatencyModel.from_dict({"format": "something else"})
    with pytest.raises(ValueError, match="version"):
        LatencyModel.from_dict({**data, "version": 99})
    # a model saved before δ existed (version 1) is refused with a pointer to recalibrate, not misread
    with pytest.raises(ValueError, match="recalibrate"):
        LatencyModel.from_dict({**data, "version": 1})
    assert data["fits"]["eager"]["prefill"]["coefficients"]["delta"] == m.coefficients(E, Equation.PREFILL).delta


def test_invalid_configuration_refused():
    with pytest.raises(ValueError, match="window"):
        LatencyModel(window=0)
    with pytest.raises(ValueError, match="min_records"):
        LatencyModel(min_records=2)
    with pytest.raises(ValueError, match="anchor_weight"):
        LatencyModel(anchor_weight=0)


def test_calibrated_finetune_tokens_is_the_largest_anchor_step():
    records = synthetic_records(random.Random(14), n=120)
    most = max(sum(r.finetune_lengths) for r in records)
    m = LatencyModel()
    assert m.calibrated_finetune_tokens() is None  # nothing measured: admission keeps the host's own limit
    m.fit(records)
    assert m.calibrated_finetune_tokens() == most
    m.observe(records[4])  # live rows refit the model but are not calibration: the range stays the sweep's
    clone = LatencyModel.from_dict(m.to_dict())
    assert clone.calibrated_finetune_tokens() is None  # coefficients alone carry no range ...
    clone.set_anchors(records)
    assert clone.calibrated_finetune_tokens() == most  # ... the profile's records do (bench._clone_model)
    no_ft = LatencyModel()
    no_ft.fit([r for r in records if not r.finetune_lengths])
    assert no_ft.calibrated_finetune_tokens() is None
