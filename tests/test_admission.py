"""Algorithm 1: each early exit, and property tests against a literal sample-by-sample transcription."""

from __future__ import annotations

import math

import pytest
from hypothesis import assume, event, given, settings
from hypothesis import strategies as st

from deltaserve_core.admission import (
    Admission,
    AdmissionDecision,
    AdmissionPool,
    AdmissionPolicy,
    AdmissionReason,
)
from deltaserve_core.finetune_data import InMemoryPool
from deltaserve_core.latency_model import DecodeCoefficients, LatencyModel, PrefillCoefficients
from deltaserve_core.slo import SLOConfig, step_budget
from deltaserve_core.types import ExecutionMode, FineTuneSample, ProposedBatch, ScheduledRequest

G, E = ExecutionMode.GRAPH, ExecutionMode.EAGER
NOW = 50.0
SLO = SLOConfig(ttft_s=1.0, tpot_s=0.15)


def make_model(scale_graph: float = 1.0, scale_eager: float = 1.0, row_cost: float = 1.0,
               coserve_cost: float = 0.0) -> LatencyModel:
    """Hand coefficients; ``row_cost`` scales Equation I's per-row δ (0: the paper's equation),
    ``coserve_cost`` its co-serving terms ζ, η (0: LoRA applied per row)."""
    m = LatencyModel()
    m.set_coefficients(G, prefill=PrefillCoefficients(1e-9 * scale_graph, 6e-5 * scale_graph, 0.0, 2e-8, 0.004,
                                                      delta=1e-4 * row_cost),
                       decode=DecodeCoefficients(5e-5 * scale_graph, 2e-8, 0.006))
    m.set_coefficients(E, prefill=PrefillCoefficients(1.1e-9 * scale_eager, 7e-5 * scale_eager, 5e-6 * scale_eager,
                                                      2.2e-8, 0.025, delta=3e-4 * row_cost,
                                                      zeta=4e-5 * coserve_cost, eta=2e-3 * coserve_cost),
                       decode=DecodeCoefficients(6e-5, 2.2e-8, 0.025))
    return m


def sample(i: int, n: int) -> FineTuneSample:
    return FineTuneSample(sample_id=i, input_ids=tuple(range(n)), loss_mask=(False,) + (True,) * (n - 1))


def pool_of(lengths) -> InMemoryPool:
    return InMemoryPool([sample(i, n) for i, n in enumerate(lengths)])


def decode_req(rid: str, last_ago: float, ctx: int = 500) -> ScheduledRequest:
    return ScheduledRequest(rid, arrival_time=0.0, context_tokens=ctx, output_tokens=20, first_token_time=1.0,
                            last_token_time=NOW - last_ago)


def prefill_req(rid: str, waited: float, n: int = 256) -> ScheduledRequest:
    return ScheduledRequest(rid, arrival_time=NOW - waited, prefill_tokens=n)


def make_batch(scheduled=(), waiting=(), mode=G) -> ProposedBatch:
    return ProposedBatch(step_id=3, now=NOW, scheduled=tuple(scheduled), waiting=tuple(waiting), mode=mode)


def decide(batch, pool, *, model=None, mixed=True, backward=False, buffer=65536, cap=4096, safety=1.0,
           overhead=0.0, **kw) -> AdmissionDecision:
    adm = Admission(model or make_model(), SLO, mixed_batches=mixed, max_ft_tokens_per_step=cap, **kw)
    adm.safety = safety
    adm.overhead_s = overhead
    return adm.decide(batch, pool=pool, buffer_free_tokens=buffer,
                      hold=AdmissionReason.BACKWARD_RUNNING if backward else None)


def test_in_memory_pool_is_an_admission_pool():
    assert isinstance(pool_of([5, 3]), AdmissionPool)


# ------------------------------------------------------------------------------------------ early exits


def test_no_admission_while_backward_runs():
    pool = pool_of([10, 20])
    d = decide(make_batch([prefill_req("p", 0.1)]), pool, backward=True)
    assert d.samples == () and d.reason is AdmissionReason.BACKWARD_RUNNING and len(pool) == 2


def test_no_admission_when_buffer_full_or_pool_empty():
    batch = make_batch([prefill_req("p", 0.1)])
    assert decide(batch, pool_of([10]), buffer=0).reason is AdmissionReason.BUFFER_FULL
    assert decide(batch, pool_of([])).reason is AdmissionReason.POOL_EMPTY


def test_decode_only_step_skipped_without_mixed_batches():
    batch = make_batch([decode_req("d", 0.01)])
    assert decide(batch, pool_of([10]), mixed=False).reason is AdmissionReason.DECODE_ONLY_STEP
    # a mixed host may append FT rows to a decode-only step
    assert decide(batch, pool_of([10]), mixed=True).reason is AdmissionReason.ADMITTED


def test_uncalibrated_model_admits_nothing():
    d = decide(make_batch([prefill_req("p", 0.1)]), pool_of([10]), model=LatencyModel())
    assert d.reason is AdmissionReason.NOT_CALIBRATED and d.samples == ()


def test_no_slack_when_inference_alone_exceeds_delta():
    # the decode's TPOT is already blown: Δ < 0
    batch = make_batch([prefill_req("p", 0.1), decode_req("d", 0.2)])
    d = decide(batch, pool_of([10]))
    assert d.reason is AdmissionReason.NO_SLACK and d.delta < 0 and d.predicted_inference > d.delta


def test_first_sample_too_long_for_budget_or_buffer():
    batch = make_batch([decode_req("d", 0.1)])  # Δ ≈ 0.05 s; eager step alone costs ~0.025 s
    d = decide(batch, pool_of([2000]))
    assert d.reason is AdmissionReason.SAMPLE_EXCEEDS_BUDGET and d.stopped_by == "budget"
    d = decide(batch, pool_of([64]), buffer=32)
    assert d.reason is AdmissionReason.SAMPLE_EXCEEDS_BUFFER and d.stopped_by == "buffer"


def test_admits_shortest_first_and_claims_them():
    pool = pool_of([300, 20, 40, 10, 5000, 80])
    batch = make_batch([prefill_req("p", 0.1), decode_req("d", 0.0)])
    d = decide(batch, pool, cap=150)
    assert [s.num_tokens for s in d.samples] == [10, 20, 40, 80]  # 10+20+40+80 = 150 = cap; 300 breaks it
    assert d.reason is AdmissionReason.ADMITTED and d.stopped_by == "buffer" and d.admitted_tokens == 150
    assert len(pool) == 2 and [s.num_tokens for s in pool.iter_by_length()] == [300, 5000]
    assert d.predicted_mixed == make_model().predict((256,), 1, 500, (10, 20, 40, 80), E)
    assert d.predicted_inference == make_model().predict((256,), 1, 500, (), G)


def test_mixed_step_is_priced_eager_and_inference_in_host_mode():
    # eager much slower than graph: the inference batch fits in graph mode, but any FT row forces eager
    model = make_model(scale_graph=1.0, scale_eager=30.0)
    batch = make_batch([prefill_req("p", 0.8, n=1000)])  # TTFT slack 0.2 s
    d = decide(batch, pool_of([16]), model=model)
    assert d.predicted_inference < d.delta
    assert d.reason is AdmissionReason.SAMPLE_EXCEEDS_BUDGET


def test_fine_tuning_only_step_uses_its_budget():
    pool = pool_of([100] * 50)
    d = decide(make_batch(), pool)  # nothing scheduled, nothing waiting: Δ = TPOT SLO = 0.15 s
    assert d.reason is AdmissionReason.ADMITTED and d.delta == SLO.tpot_s and d.predicted_inference == 0.0
    assert d.predicted_mixed <= 0.15
    assert d.budget.binding == "ft_only"
    # a tighter FT-only budget admits less; FT-only steps are prefill steps, allowed on non-mixed hosts too
    d2 = decide(make_batch(), pool_of([100] * 50), ft_only_budget_s=0.05, mixed=False)
    assert 0 < len(d2.samples) < len(d.samples)


def test_non_mixed_host_charges_deferred_decodes():
    batch = make_batch([prefill_req("p", 0.1)], waiting=[decode_req("d", 0.08, ctx=2000)])
    graph_calls = []

    def graph_mode(b: ProposedBatch) -> ExecutionMode:
        graph_calls.append(b)
        return G

    d = decide(batch, pool_of([32] * 100), mixed=False, decode_mode=graph_mode)
    d_wait = make_model().predict((), 1, 2000, (), G)
    assert d.budget.deferred_cost == pytest.approx(d_wait)
    assert d.delta == pytest.approx(0.15 - 0.08 - d_wait)
    assert graph_calls and graph_calls[0].scheduled[0].request_id == "d"
    assert d.predicted_mixed <= d.delta


def test_constructor_refuses_bad_limits():
    with pytest.raises(ValueError, match="max_ft_tokens_per_step"):
        Admission(make_model(), SLO, mixed_batches=True, max_ft_tokens_per_step=0)
    with pytest.raises(ValueError, match="ft_only_budget_s"):
        Admission(make_model(), SLO, mixed_batches=True, max_ft_tokens_per_step=10, ft_only_budget_s=0.0)


def test_a_held_step_carries_the_callers_reason():
    pool = pool_of([10, 20])
    d = decide(make_batch([prefill_req("p", 0.1)]), pool, backward=False)
    assert d.reason is AdmissionReason.ADMITTED
    adm = Admission(make_model(), SLO, mixed_batches=True, max_ft_tokens_per_step=4096)
    held = adm.decide(make_batch([prefill_req("p", 0.1)]), pool=pool_of([10]), buffer_free_tokens=100,
                      hold=AdmissionReason.INSTALL_PENDING)
    assert held.samples == () and held.reason is AdmissionReason.INSTALL_PENDING


def test_policy_values():
    assert AdmissionPolicy() == AdmissionPolicy.default()
    paper = AdmissionPolicy.paper()
    assert (paper.safety_quantile, paper.cap_extension, paper.cap_to_calibration) == (None, False, False)
    assert AdmissionPolicy.idle_only().idle_steps_only and not AdmissionPolicy.no_interrupt().interrupt
    with pytest.raises(ValueError, match="safety_quantile"):
        AdmissionPolicy(safety_quantile=1.5)
    assert Admission(make_model(), SLO, mixed_batches=True, max_ft_tokens_per_step=10, policy=paper).margin is None


def test_idle_only_policy_names_its_refusal():
    adm = Admission(make_model(), SLO, mixed_batches=True, max_ft_tokens_per_step=4096,
                    policy=AdmissionPolicy.idle_only())
    d = adm.decide(make_batch([decode_req("d", 0.01)]), pool=pool_of([10]), buffer_free_tokens=100)
    assert d.samples == () and d.reason is AdmissionReason.POLICY_EXCLUDES_STEP
    assert adm.decide(make_batch(), pool=pool_of([10]), buffer_free_tokens=100).samples


def test_spare_time_and_decision_share_one_price():
    """The host-work check and the decision price the step once, as LatencyModel.predict_batch does."""
    model = make_model()
    adm = Admission(model, SLO, mixed_batches=True, max_ft_tokens_per_step=4096, policy=AdmissionPolicy.paper())
    batch = make_batch([prefill_req("p", 0.1), decode_req("d", 0.01)])
    budget = step_budget(batch, SLO, model)
    assert adm.spare_s(batch) == max(0.0, budget.delta - model.predict_batch(batch))
    d = adm.decide(batch, pool=pool_of([10]), buffer_free_tokens=100)
    assert d.predicted_inference == model.predict_batch(batch) and d.budget == budget


# ---------------------------------------------------------------------------------------- the pool


def test_pool_claim_and_release():
    pool = pool_of([40, 10, 30, 20])
    order = list(pool.iter_by_length())
    assert [s.num_tokens for s in order] == [10, 20, 30, 40]
    pool.claim(order[:2])
    assert len(pool) == 2
    pool.release([s.sample_id for s in order[:2]])  # undo of the latest claim (aborted step)
    assert [s.num_tokens for s in pool.iter_by_length()] == [10, 20, 30, 40]
    pool.claim([order[2]])  # not a prefix: skipped lazily
    assert [s.num_tokens for s in pool.iter_by_length()] == [10, 20, 40] and len(pool) == 3
    with pytest.raises(ValueError, match="already claimed"):
        pool.claim([order[2]])
    pool.claim(order[:2])
    assert [s.num_tokens for s in pool.iter_by_length()] == [40]
    pool.release([order[1].sample_id, order[2].sample_id])
    assert [s.num_tokens for s in pool.iter_by_length()] == [20, 30, 40]
    with pytest.raises(ValueError, match="already"):
        pool.release([order[3].sample_id])
    with pytest.raises(ValueError, match="unique"):
        InMemoryPool([sample(1, 5), sample(1, 6)])


# --------------------------------------------------------------------------------- property tests


def reference_greedy(batch, pool_lengths, model, delta, limit, safety=1.0, overhead=0.0):
    """Lines 11-22 transcribed literally, pricing every candidate set with LatencyModel.predict; a step with
    inference must fit (Δ − overhead) / safety (safety 1, overhead 0: the paper's rule)."""
    prefill = [r.prefill_tokens for r in batch.scheduled if r.prefill_tokens > 0]
    bd = sum(1 for r in batch.scheduled if r.prefill_tokens == 0)
    kv = sum(r.context_tokens for r in batch.scheduled if r.prefill_tokens == 0)
    # an empty batch is a fine-tuning-only step: no inference cost (predict_batch would price 0 decodes at c′)
    if batch.scheduled and model.predict_batch(batch) > delta:
        return None
    bound = delta
    if batch.scheduled:  # fine-tuning rows lengthen a step with inference by at most the TPOT SLO
        bound = min(delta, model.predict_batch(batch) + SLO.tpot_s)
        bound = (bound - overhead) / safety
    chosen: list[int] = []
    for n in sorted(pool_lengths):
        if sum(chosen) + n > limit:
            break
        if model.predict(prefill, bd, kv, chosen + [n], E) > bound:
            break
        chosen.append(n)
    return chosen


def rarely(draw, value, otherwise):
    """``value`` one time in ten (hypothesis has no weights; this keeps the interesting cases common)."""
    return value if 40 <= draw(st.integers(0, 99)) < 50 else draw(otherwise)


@st.composite
def scenario(draw):
    scheduled = []
    for i in range(draw(st.integers(0, 10))):
        if draw(st.booleans()):
            scheduled.append(prefill_req(f"p{i}", draw(st.floats(0.0, 0.9)), draw(st.integers(1, 600))))
        else:
            scheduled.append(decode_req(f"d{i}", rarely(draw, 0.2, st.floats(0.0, 0.08)), draw(st.integers(0, 4000))))
    waiting = [prefill_req(f"w{i}", draw(st.floats(0.0, 0.9)), draw(st.integers(1, 1024)))
               for i in range(draw(st.integers(0, 3)))]
    lengths = draw(st.lists(st.integers(2, 400), min_size=rarely(draw, 0, st.just(1)), max_size=60))
    return dict(
        batch=make_batch(scheduled, waiting, mode=draw(st.sampled_from([G, E]))),
        lengths=lengths,
        model=make_model(draw(st.floats(0.1, 2.0)), draw(st.floats(0.1, 2.0)),
                         rarely(draw, 0.0, st.floats(0.0, 20.0)), rarely(draw, 0.0, st.floats(0.0, 20.0))),
        mixed=rarely(draw, False, st.just(True)),
        backward=rarely(draw, True, st.just(False)),
        buffer=rarely(draw, draw(st.integers(-5, 0)), st.integers(400, 6000)),
        cap=rarely(draw, draw(st.integers(1, 60)), st.integers(60, 5000)),
        safety=rarely(draw, 1.0, st.floats(1.0, 2.0)),
        overhead=rarely(draw, 0.0, st.floats(0.0, 0.05)),
    )


@settings(max_examples=300, deadline=None)
@given(sc=scenario())
def test_admission_properties(sc):
    batch, model = sc["batch"], sc["model"]
    pool = pool_of(sc["lengths"])
    d = decide(batch, pool, model=model, mixed=sc["mixed"], backward=sc["backward"], buffer=sc["buffer"],
               cap=sc["cap"], safety=sc["safety"], overhead=sc["overhead"])
    tokens = [s.num_tokens for s in d.samples]
    event(d.reason.value)

    # never while backward runs; never more than the buffer or the per-step cap
    if sc["backward"]:
        assert d.samples == () and d.reason is AdmissionReason.BACKWARD_RUNNING
    assert sum(tokens) <= max(0, min(sc["buffer"], sc["cap"]))
    # claimed exactly what was admitted
    assert len(pool) == len(sc["lengths"]) - len(d.samples)
    if not d.samples:
        assert d.predicted_mixed is None
        return
    # the admitted set's predicted (eager) time is within Δ, computed independently
    prefill = [r.prefill_tokens for r in batch.scheduled if r.prefill_tokens > 0]
    bd = sum(1 for r in batch.scheduled if r.prefill_tokens == 0)
    kv = sum(r.context_tokens for r in batch.scheduled if r.prefill_tokens == 0)
    predicted = model.predict(prefill, bd, kv, tokens, E)
    delta = step_budget(batch, SLO, model, mixed_batches=sc["mixed"]).delta
    assert d.delta == delta
    # the margin is honoured by steps with inference; fine-tuning-only steps are not held by it
    margin = (delta - sc["overhead"]) / sc["safety"] if batch.scheduled else delta
    assert predicted <= margin
    assert d.predicted_mixed == predicted  # bit-identical to the estimator
    assert not (not sc["mixed"] and batch.scheduled and not batch.has_prefill)


@settings(max_examples=300, deadline=None)
@given(sc=scenario())
def test_admitted_set_is_exactly_the_greedy_increasing_length_prefix(sc):
    assume(not sc["backward"] and sc["buffer"] > 0 and sc["lengths"])
    batch, model = sc["batch"], sc["model"]
    assume(sc["mixed"] or not batch.scheduled or batch.has_prefill)
    d = decide(batch, pool_of(sc["lengths"]), model=model, mixed=sc["mixed"], buffer=sc["buffer"], cap=sc["cap"],
               safety=sc["safety"], overhead=sc["overhead"])
    delta = step_budget(batch, SLO, model, mixed_batches=sc["mixed"]).delta
    want = reference_greedy(batch, sc["lengths"], model, delta, min(sc["buffer"], sc["cap"]), sc["safety"],
                            sc["overhead"])
    event(f"greedy admits {'none' if not want else 'some'}; stopped by {d.stopped_by}")
    if want is None:
        assert d.reason is AdmissionReason.NO_SLACK and d.samples == ()
        return
    assert [s.num_tokens for s in d.samples] == want
    assert d.samples == tuple(sorted(d.samples, key=lambda s: (s.num_tokens, s.sample_id)))


def test_large_walk_matches_reference():
    """Many short samples: the walk spans several blocks and the result is still the literal greedy prefix."""
    lengths = [2 + (i * 7919) % 300 for i in range(5000)]
    stops = set()
    for batch in (make_batch([prefill_req("p", 0.05, n=64)]), make_batch([decode_req("d", 0.05, ctx=900)])):
        for cap in (1, 2, 3, 100, 1000, 4096, 20000):
            model = make_model()
            d = decide(batch, pool_of(lengths), model=model, cap=cap, buffer=10**6)
            delta = step_budget(batch, SLO, model).delta
            assert [s.num_tokens for s in d.samples] == reference_greedy(batch, lengths, model, delta, cap)
            stops.add(d.stopped_by)
    assert stops == {"buffer", "budget"}


def test_row_cost_favours_fewer_rows():
    """δ prices each admitted sample as a row: with a large per-row cost the same token budget admits fewer
    short samples than the paper's equation (δ = 0) would, and exactly the literal greedy prefix."""
    batch = make_batch([prefill_req("p", 0.05, n=64)])
    lengths = [8] * 400
    counts = {}
    for row_cost in (0.0, 30.0):
        model = make_model(row_cost=row_cost)
        d = decide(batch, pool_of(lengths), model=model, buffer=10**6)
        delta = step_budget(batch, SLO, model).delta
        assert [s.num_tokens for s in d.samples] == reference_greedy(batch, lengths, model, delta, 4096)
        assert d.predicted_mixed == model.predict((64,), 0, 0, [s.num_tokens for s in d.samples], E)
        counts[row_cost] = len(d.samples)
    assert 0 < counts[30.0] < counts[0.0]


def test_nan_free_decision_fields_when_delta_computed():
    d = decide(make_batch([prefill_req("p", 0.1)]), pool_of([10, 20]))
    assert not math.isnan(d.delta) and not math.isnan(d.predicted_inference)


def test_fine_tuning_lengthens_a_step_by_at_most_the_ft_only_budget():
    """A fresh prompt has ~1 s of TTFT slack, but a request arriving while its step runs waits for all of it: the
    rows admitted may add at most the fine-tuning-only budget (the TPOT SLO) to the step; the paper's rule
    (policy=AdmissionPolicy(cap_extension=False)) fills the step up to Δ."""
    batch = make_batch([prefill_req("p", 0.0, n=64)])
    lengths = [200] * 400
    capped = decide(batch, pool_of(lengths))
    paper = decide(batch, pool_of(lengths), policy=AdmissionPolicy(cap_extension=False))
    assert capped.samples and paper.samples
    assert capped.predicted_mixed <= capped.predicted_inference + SLO.tpot_s
    assert paper.predicted_mixed > paper.predicted_inference + SLO.tpot_s  # the scenario is one the cap changes
    assert paper.predicted_mixed <= paper.delta and len(paper.samples) > len(capped.samples)
    # a tighter fine-tuning-only budget tightens the cap too
    tight = decide(batch, pool_of(lengths), ft_only_budget_s=0.05)
    assert tight.predicted_mixed <= tight.predicted_inference + 0.05 and len(tight.samples) < len(capped.samples)
