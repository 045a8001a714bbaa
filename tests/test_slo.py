"""SLO configuration and the per-step budget Δ: hand-computed cases, then the one-pass scan vs the pure rules."""

from __future__ import annotations

import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from deltaserve_core.latency_model import DecodeCoefficients, LatencyModel, PrefillCoefficients
from deltaserve_core.slo import (
    SLOConfig,
    avg_tpot_slack,
    deferred_decode_cost,
    step_budget,
    tpot_slack,
    ttft_slack,
)
from deltaserve_core.types import ExecutionMode, ProposedBatch, RequestSLO, ScheduledRequest

G, E = ExecutionMode.GRAPH, ExecutionMode.EAGER
NOW = 100.0


def model() -> LatencyModel:
    m = LatencyModel()
    m.set_coefficients(G, prefill=PrefillCoefficients(1e-8, 4e-5, 0.0, 1e-8, 0.004),
                       decode=DecodeCoefficients(4e-5, 1e-8, 0.005))
    m.set_coefficients(E, prefill=PrefillCoefficients(2e-8, 5e-5, 1e-5, 2e-8, 0.02),
                       decode=DecodeCoefficients(5e-5, 2e-8, 0.02))
    return m


def prefill(rid, arrival, n=100, slo=None):
    return ScheduledRequest(rid, arrival_time=arrival, prefill_tokens=n, slo=slo)


def decode(rid, last, first=None, ctx=500, out=10, slo=None):
    return ScheduledRequest(rid, arrival_time=0.0, context_tokens=ctx, output_tokens=out,
                            first_token_time=first if first is not None else last - 1.0, last_token_time=last,
                            slo=slo)


def batch(scheduled=(), waiting=(), mode=G):
    return ProposedBatch(step_id=7, now=NOW, scheduled=tuple(scheduled), waiting=tuple(waiting), mode=mode)


# --------------------------------------------------------------------------------------------- SLOConfig


@pytest.mark.parametrize("kwargs, field", [
    ({"ttft_s": 0, "tpot_s": 0.1}, "ttft_s"),
    ({"ttft_s": -1.0, "tpot_s": 0.1}, "ttft_s"),
    ({"ttft_s": 1.0, "tpot_s": 0.0}, "tpot_s"),
    ({"ttft_s": 1.0, "tpot_s": math.nan}, "tpot_s"),
    ({"ttft_s": 1.0, "tpot_s": math.inf}, "tpot_s"),
    ({"ttft_s": 1.0, "tpot_s": 0.1, "avg_tpot_s": 0.0}, "avg_tpot_s"),
    ({"ttft_s": True, "tpot_s": 0.1}, "ttft_s"),
    ({"ttft_s": "1", "tpot_s": 0.1}, "ttft_s"),
])
def test_bad_slo_refused_with_what_to_fix(kwargs, field):
    with pytest.raises(ValueError) as info:
        SLOConfig(**kwargs)
    message = str(info.value)
    assert field in message and "positive" in message


def test_request_overrides():
    slo = SLOConfig(ttft_s=1.0, tpot_s=0.1, avg_tpot_s=0.05)
    assert slo.for_request(None) == (1.0, 0.1, 0.05)
    assert slo.for_request(RequestSLO(tpot_s=0.2)) == (1.0, 0.2, 0.05)
    assert slo.for_request(RequestSLO(ttft_s=3.0, avg_tpot_s=0.07)) == (3.0, 0.1, 0.07)
    with pytest.raises(ValueError, match="None"):
        RequestSLO(ttft_s=0.0)


# ---------------------------------------------------------------------------------------- the pure rules


def test_pure_rules_by_hand():
    assert ttft_slack(now=10.0, arrival_time=9.7, ttft_s=1.0) == pytest.approx(0.7)
    assert ttft_slack(now=10.0, arrival_time=9.7, ttft_s=1.0, remaining_cost_s=0.2) == pytest.approx(0.5)
    assert tpot_slack(now=10.0, last_token_time=9.96, tpot_s=0.1) == pytest.approx(0.06)
    assert tpot_slack(now=10.0, last_token_time=9.96, tpot_s=0.1, deferred_cost_s=0.05) == pytest.approx(0.01)
    # 10 tokens, first at 9.5: the 11th may land by 9.5 + 10·0.06 = 10.1, i.e. 0.1 s from now
    assert avg_tpot_slack(now=10.0, first_token_time=9.5, output_tokens=10, avg_tpot_s=0.06) == pytest.approx(0.1)
    assert avg_tpot_slack(10.0, 9.9, 1, 0.2) == pytest.approx(0.1)


def test_deferred_decode_cost():
    m = model()
    assert deferred_decode_cost(m, 0, 0) == 0.0
    assert deferred_decode_cost(None, 5, 100) == 0.0
    assert deferred_decode_cost(m, 4, 2000, G) == pytest.approx(4e-5 * 4 + 1e-8 * 2000 + 0.005)
    assert deferred_decode_cost(m, 4, 2000) == pytest.approx(5e-5 * 4 + 2e-8 * 2000 + 0.02)  # the slower mode


# ------------------------------------------------------------------------------------- step_budget by hand


def test_tpot_binds_when_a_decode_is_late():
    slo = SLOConfig(ttft_s=1.0, tpot_s=0.1)
    b = batch([prefill("p", arrival=NOW - 0.3), decode("d1", last=NOW - 0.04), decode("d2", last=NOW - 0.01)])
    budget = step_budget(b, slo, model())
    assert budget.ttft == pytest.approx(0.7)
    assert budget.tpot == pytest.approx(0.06)
    assert budget.delta == pytest.approx(0.06) and budget.binding == "tpot" and budget.request_id == "d1"
    assert math.isinf(budget.avg_tpot) and math.isinf(budget.ft_only)
    assert (budget.num_prefill, budget.prefill_tokens, budget.prefill_sq, budget.num_decode, budget.kv_tokens) \
        == (1, 100, 10_000, 2, 1000)


def test_earliest_arrival_binds_ttft_and_queue_wait_counts():
    slo = SLOConfig(ttft_s=1.0, tpot_s=0.5)
    b = batch([prefill("late", arrival=NOW - 0.1), prefill("early", arrival=NOW - 0.6)])
    budget = step_budget(b, slo, model())
    assert budget.delta == pytest.approx(0.4) and budget.request_id == "early" and budget.binding == "ttft"


def test_waiting_request_charge_includes_its_row():
    """With Equation I's per-row δ the queued request's own prefill step costs at least one row more."""
    m = LatencyModel()
    m.set_coefficients(G, prefill=PrefillCoefficients(1e-8, 4e-5, 0.0, 1e-8, 0.004, delta=0.003),
                       decode=DecodeCoefficients(4e-5, 1e-8, 0.005))
    m.set_coefficients(E, prefill=PrefillCoefficients(2e-8, 5e-5, 1e-5, 2e-8, 0.02, delta=0.001),
                       decode=DecodeCoefficients(5e-5, 2e-8, 0.02))
    own = 1e-8 * 1000**2 + 4e-5 * 1000 + 0.004 + 0.001  # coefficient-wise minimum over modes, R = 1
    assert m.min_prefill_time(1000) == pytest.approx(own)
    assert own <= min(m.predict((1000,), 0, 0, (), mode) for mode in (G, E))
    slo = SLOConfig(ttft_s=1.0, tpot_s=0.5)
    b = batch([prefill("p", arrival=NOW - 0.1)], waiting=[prefill("w", arrival=NOW - 0.5, n=1000)])
    assert step_budget(b, slo, m).delta == pytest.approx(0.5 - own)


def test_waiting_request_is_charged_its_own_prefill_step():
    """A queued prompt sits out this step and then needs its own prefill: Δ leaves room for that step."""
    m = model()
    slo = SLOConfig(ttft_s=1.0, tpot_s=0.5)
    b = batch([prefill("p", arrival=NOW - 0.1)], waiting=[prefill("w", arrival=NOW - 0.5, n=1000)])
    own = min(1e-8, 2e-8) * 1000**2 + min(4e-5, 5e-5) * 1000 + min(0.004, 0.02)  # cheapest mode, lower bound
    assert m.min_prefill_time(1000) == pytest.approx(own)
    budget = step_budget(b, slo, m)
    assert budget.delta == pytest.approx(0.5 - own) and budget.request_id == "w"
    assert budget.ttft == pytest.approx(ttft_slack(NOW, NOW - 0.5, 1.0, own))
    # without a model the queue wait alone counts
    assert step_budget(b, slo).delta == pytest.approx(0.5)


def test_non_mixed_host_charges_deferred_decodes_to_tpot():
    m = model()
    slo = SLOConfig(ttft_s=2.0, tpot_s=0.2)
    deferred = [decode("d1", last=NOW - 0.05, ctx=1000), decode("d2", last=NOW - 0.02, ctx=3000)]
    b = batch([prefill("p", arrival=NOW - 0.1, n=512)], waiting=deferred)
    d_wait = 4e-5 * 2 + 1e-8 * 4000 + 0.005  # Eq. II over both deferred decodes, graph mode
    budget = step_budget(b, slo, m, mixed_batches=False, deferred_mode=G)
    assert budget.deferred_cost == pytest.approx(d_wait)
    assert budget.tpot == pytest.approx(tpot_slack(NOW, NOW - 0.05, 0.2, d_wait))
    assert budget.delta == budget.tpot and budget.request_id == "d1"
    # a mixed host does not defer decodes: D_wait is empty and waiting decodes are not charged
    mixed = step_budget(b, slo, m, mixed_batches=True)
    assert mixed.deferred_cost == 0.0 and math.isinf(mixed.tpot) and mixed.delta == pytest.approx(1.9)


def test_average_tpot():
    slo = SLOConfig(ttft_s=1.0, tpot_s=0.5, avg_tpot_s=0.06)
    b = batch([decode("d", last=NOW - 0.01, first=NOW - 0.5, out=10)])
    budget = step_budget(b, slo, model())
    assert budget.avg_tpot == pytest.approx(0.1) and budget.binding == "avg_tpot" and budget.delta == pytest.approx(0.1)


def test_per_request_overrides_win():
    slo = SLOConfig(ttft_s=1.0, tpot_s=0.1)
    b = batch([
        prefill("early", arrival=NOW - 0.5),  # default TTFT: 0.5 left
        prefill("strict", arrival=NOW - 0.1, slo=RequestSLO(ttft_s=0.3)),  # 0.2 left
        decode("relaxed", last=NOW - 0.09, slo=RequestSLO(tpot_s=1.0)),  # 0.91 left
    ])
    budget = step_budget(b, slo, model())
    assert budget.delta == pytest.approx(0.2) and budget.request_id == "strict"
    assert budget.tpot == pytest.approx(0.91)


def test_fine_tuning_only_step():
    slo = SLOConfig(ttft_s=1.0, tpot_s=0.1)
    budget = step_budget(batch(), slo, model())
    assert budget.delta == 0.1 and budget.binding == "ft_only" and budget.request_id is None
    assert step_budget(batch(), slo, model(), ft_only_budget_s=0.03).delta == 0.03
    # nothing scheduled but a queued prompt: its TTFT still bounds the step
    queued = batch(waiting=[prefill("w", arrival=NOW - 0.98, n=10)])
    assert step_budget(queued, slo, None).delta == pytest.approx(0.02)


def test_last_token_time_missing_falls_back_to_first_token():
    slo = SLOConfig(ttft_s=1.0, tpot_s=0.1)
    r = ScheduledRequest("d", 0.0, context_tokens=5, output_tokens=1, first_token_time=NOW - 0.03)
    assert step_budget(batch([r]), slo).tpot == pytest.approx(0.07)


# ------------------------------------------------------------------- the scan agrees with the pure rules

times = st.floats(0.0, 5.0)
slo_overrides = st.none() | st.builds(RequestSLO, ttft_s=st.none() | st.floats(0.05, 3.0),
                                      tpot_s=st.none() | st.floats(0.01, 0.5),
                                      avg_tpot_s=st.none() | st.floats(0.01, 0.5))


@st.composite
def requests(draw):
    started = draw(st.booleans())
    arrival = NOW - draw(times)
    override = draw(slo_overrides)
    if not started:
        return ScheduledRequest(draw(st.uuids()).hex, arrival, prefill_tokens=draw(st.integers(1, 4096)),
                                slo=override)
    first = min(NOW, arrival + draw(st.floats(0.0, 1.0)))
    last = draw(st.none() | st.floats(first, NOW))
    return ScheduledRequest(draw(st.uuids()).hex, arrival, prefill_tokens=draw(st.sampled_from([0, 0, 0, 64])),
                            context_tokens=draw(st.integers(0, 4096)), output_tokens=draw(st.integers(1, 500)),
                            first_token_time=first, last_token_time=last, slo=override)


@settings(max_examples=150, deadline=None)
@given(scheduled=st.lists(requests(), max_size=12), waiting=st.lists(requests(), max_size=6),
       mixed=st.booleans(), avg=st.none() | st.floats(0.02, 0.3))
def test_step_budget_is_the_minimum_of_the_per_request_rules(scheduled, waiting, mixed, avg):
    m = model()
    slo = SLOConfig(ttft_s=1.0, tpot_s=0.1, avg_tpot_s=avg)
    b = batch(scheduled, waiting)
    deferred = [r for r in waiting if r.first_token_time is not None and not mixed]
    d_wait = deferred_decode_cost(m, len(deferred), sum(r.context_tokens for r in deferred))
    slacks = []
    for r, queued in [(r, False) for r in scheduled] + [(r, True) for r in waiting]:
        ttft, tpot, avg_s = slo.for_request(r.slo)
        if r.first_token_time is None:
            slacks.append(ttft_slack(NOW, r.arrival_time, ttft, m.min_prefill_time(r.prefill_tokens) if queued else 0))
            continue
        if queued and mixed:
            continue
        charge = d_wait if queued else 0.0
        last = r.last_token_time if r.last_token_time is not None else r.first_token_time
        slacks.append(tpot_slack(NOW, last, tpot, charge))
        if avg_s is not None:
            slacks.append(avg_tpot_slack(NOW, r.first_token_time, r.output_tokens, avg_s, charge))
    if not scheduled:
        slacks.append(slo.tpot_s)
    want = min(slacks, default=math.inf)
    got = step_budget(b, slo, m, mixed_batches=mixed).delta
    assert got == pytest.approx(want, rel=1e-9, abs=1e-9)


def test_slo_monitor_counts_ttft_and_mean_tpot_from_the_views():
    from deltaserve_core.slo import SLOMonitor
    from deltaserve_core.types import RequestSLO

    mon = SLOMonitor(SLOConfig(ttft_s=1.0, tpot_s=0.1), every_s=0.5)
    assert mon.attainment() == {"requests": 0, "ttft": None, "tpot": None, "slo": None}

    def view(rid, arrival, first=None, last=None, out=0, slo=None):
        return ScheduledRequest(rid, arrival, 0, 10, out, first, last, slo)

    mon.observe(ProposedBatch(0, now=10.0, scheduled=(
        view("fast", 9.0, first=9.5, last=9.7, out=4),        # TTFT 0.5, mean TPOT 0.067: both met
        view("slow-first", 7.0, first=8.5, last=8.55, out=2),  # TTFT 1.5: missed
        view("waiting", 9.9),                                 # no token yet: not counted
    ), waiting=(view("own-slo", 6.0, first=7.8, last=8.6, out=3, slo=RequestSLO(ttft_s=2.0, tpot_s=0.5)),)))
    # a view within every_s of the last sample is skipped (the scheduling path pays for one read in many)
    mon.observe(ProposedBatch(1, now=10.2, scheduled=(view("slow-tpot", 9.0, first=9.1, last=10.1, out=3),)))
    assert mon.attainment() == {"requests": 3, "ttft": 2 / 3, "tpot": 1.0, "slo": 2 / 3}
    mon.observe(ProposedBatch(2, now=10.6, scheduled=(view("slow-tpot", 9.0, first=9.1, last=10.1, out=3),)))
    got = mon.attainment()
    assert got == {"requests": 4, "ttft": 3 / 4, "tpot": 3 / 4, "slo": 2 / 4}  # its mean TPOT 0.5 > 0.1


def test_slo_monitor_memory_is_bounded():
    from deltaserve_core.slo import SLOMonitor

    mon = SLOMonitor(SLOConfig(ttft_s=1.0, tpot_s=0.1), every_s=0.0, capacity=10)
    for i in range(50):
        mon.observe(ProposedBatch(i, now=float(i), scheduled=(ScheduledRequest(f"r{i}", i - 0.5, 0, 5, 1, i - 0.1 if i % 2 else i + 1.0, None),)))
    assert len(mon._live) == 10
    got = mon.attainment()
    assert got["requests"] == 50 and got["ttft"] == 0.5 and got["tpot"] is None
