"""SLOMargin: the measured factor and overhead admission holds steps with inference to."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from deltaserve_core.slo_margin import SLOMargin
from deltaserve_core.types import ExecutionMode, StepRecord

E = ExecutionMode.EAGER


def mixed(step: int, start: float, duration: float, *, decodes: int = 3) -> StepRecord:
    return StepRecord(step, start, duration, E, num_decode=decodes, kv_tokens=40, finetune_sample_ids=(step,),
                      finetune_lengths=(16,))


def alone(step: int, start: float, duration: float) -> StepRecord:
    return StepRecord(step, start, duration, E, finetune_sample_ids=(step,), finetune_lengths=(64,))


def decode(step: int, start: float, duration: float) -> StepRecord:
    return StepRecord(step, start, duration, E, num_decode=3, kv_tokens=40)


def test_prior_then_proxies_then_mixed_steps_decide_the_factor() -> None:
    m = SLOMargin(min_samples=2, window=32, drift_window=0, warmup_factor=1.0)
    assert m.factor == 1.0
    m.seed(0.25)  # calibration p95 error 25 %
    assert m.factor == pytest.approx(1.25)
    m.observe(alone(0, 0.0, 0.12), 0.1)
    assert m.factor == pytest.approx(1.25)  # proxies only ever raise the prior
    m.observe(alone(1, 1.0, 0.15), 0.1)
    assert m.factor == pytest.approx(1.5)  # from the first proxy that shows more error
    m.observe(mixed(2, 2.0, 0.17), 0.1)
    assert m.factor == pytest.approx(1.7)  # a mixed step counts at once, before min_samples of them
    m.observe(mixed(3, 3.0, 0.09), 0.1)
    m.observe(mixed(4, 4.0, 0.10), 0.1)
    # mixed steps are the ones the margin protects: once min_samples are measured, they alone decide
    assert m.factor == pytest.approx(1.7)
    assert m.mixed_samples == 3
    for i in range(5, 40):
        m.observe(mixed(i, float(i), 0.11), 0.1)
    assert m.factor == pytest.approx(1.1)  # the early outlier left the window; proxies no longer count


def test_eager_inference_steps_are_proxies_graph_steps_are_not() -> None:
    m = SLOMargin(min_samples=1, drift_window=0, warmup_factor=1.0)
    m.observe(StepRecord(0, 0.0, 0.03, ExecutionMode.GRAPH, num_decode=3, kv_tokens=40), 0.01)
    assert m.factor == 1.0  # a replayed decode graph is not what a mixed step runs; its jitter is not evidence
    m.observe(StepRecord(1, 1.0, 0.18, E, prefill_lengths=(100,), num_decode=3, kv_tokens=40), 0.1)
    assert m.factor == pytest.approx(1.8)  # an eager step with a prompt, priced by the same model, is a proxy
    m.observe(mixed(2, 2.0, 0.1), 0.1)
    assert m.factor == 1.0  # min_samples=1: the one mixed step decides


def test_factor_is_the_windows_quantile_clamped_to_one_and_max_factor() -> None:
    m = SLOMargin(window=4, min_samples=1, max_factor=2.0)
    for i, r in enumerate((0.5, 0.6, 0.7, 0.8)):
        m.observe(mixed(i, float(i), 0.1 * r), 0.1)
    assert m.factor == 1.0  # over-predicted steps never lower the bound below Δ
    m.observe(mixed(9, 9.0, 0.5), 0.1)
    assert m.factor == 2.0
    for i in range(4):  # the outlier leaves the window
        m.observe(mixed(10 + i, 10.0 + i, 0.11), 0.1)
    assert m.factor == pytest.approx(1.1)
    median = SLOMargin(quantile=0.75, window=4, min_samples=1)
    for i, r in enumerate((1.0, 1.1, 1.2, 1.9)):
        median.observe(mixed(i, float(i), 0.1 * r), 0.1)
    assert median.factor == pytest.approx(1.9)  # index int(0.75 * 4) = 3 of the sorted window


def test_overhead_is_time_between_a_step_and_the_next_that_continues_its_decodes() -> None:
    m = SLOMargin()
    m.observe(decode(0, 10.0, 0.05), None)
    m.observe(decode(1, 10.053, 0.05), None)  # 3 ms of host time between the two
    assert m.overhead_s == pytest.approx(0.003)
    m.observe(alone(2, 20.0, 0.2), 0.2)  # idle time before a fine-tuning-only step is not overhead
    m.observe(decode(3, 30.0, 0.05), None)  # nor the time before decodes that did not run in the previous step
    assert m.overhead_s == pytest.approx(0.003)
    m.observe(decode(4, 30.058, 0.05), None)
    assert m.overhead_s == pytest.approx(0.008)


def test_proxy_median_is_a_floor_once_mixed_steps_decide() -> None:
    m = SLOMargin(min_samples=1, drift_window=4)
    m.observe(mixed(0, 0.0, 0.11), 0.1)
    assert m.factor == pytest.approx(1.1)
    for i, r in enumerate((1.0, 1.0, 1.0)):
        m.observe(decode(1 + i, 1.0 + i, 0.1 * r), 0.1)
    assert m.factor == pytest.approx(1.1)  # too few proxies for a median yet
    for i, r in enumerate((1.6, 1.7, 3.0)):  # the machine slows down as a whole; one step jitters far more
        m.observe(decode(4 + i, 4.0 + i, 0.1 * r), 0.1)
    assert m.factor == pytest.approx(1.7)  # window (1.0, 1.6, 1.7, 3.0): the median, not the outlier
    for i in range(4):
        m.observe(decode(8 + i, 8.0 + i, 0.1), 0.1)
    assert m.factor == pytest.approx(1.1)  # drift gone: the mixed steps decide again


def test_until_min_samples_mixed_steps_ran_the_factor_is_at_least_the_warmup_factor() -> None:
    m = SLOMargin(min_samples=2)
    m.seed(0.19)
    assert m.factor == 2.0  # default warm-up: max_factor, half the budget for the first mixed steps
    m.observe(mixed(0, 0.0, 0.12), 0.1)
    assert m.factor == 2.0
    m.observe(mixed(1, 1.0, 0.11), 0.1)
    assert m.factor == pytest.approx(1.2)  # measured: the mixed steps decide
    assert SLOMargin(warmup_factor=1.5).factor == 1.5


def test_unpriced_and_aborted_steps_leave_the_factor_alone() -> None:
    m = SLOMargin(min_samples=1, warmup_factor=1.0)
    m.observe(mixed(1, 1.0, 0.3), None)
    aborted = StepRecord(2, 2.0, 0.3, E, aborted_sample_ids=(2,))
    m.observe(aborted, 0.1)
    m.observe(decode(3, 3.0, 0.3), None)
    assert m.factor == 1.0 and m.mixed_samples == 0


@pytest.mark.parametrize("kwargs, match", [
    ({"quantile": 0.5}, "quantile"), ({"quantile": 1.2}, "quantile"),
    ({"window": 4, "min_samples": 5}, "min_samples"), ({"max_factor": 0.9}, "max_factor"),
    ({"drift_window": -1}, "drift_window"),
    ({"warmup_factor": 0.5}, "warmup_factor"),
    ({"warmup_factor": 2.5}, "warmup_factor"),
])
def test_bad_settings_are_refused(kwargs: dict, match: str) -> None:
    with pytest.raises(ValueError, match=match):
        SLOMargin(**kwargs)


@settings(max_examples=200, deadline=None)
@given(ratios=st.lists(st.floats(0.2, 5.0), min_size=1, max_size=80), q=st.sampled_from([0.9, 0.95, 1.0]))
def test_factor_bounds_every_windowed_ratio_it_claims_to(ratios: list[float], q: float) -> None:
    m = SLOMargin(quantile=q, window=16, min_samples=1, max_factor=3.0, drift_window=8)
    for i, r in enumerate(ratios):
        m.observe(mixed(i, float(i), 0.1 * r), 0.1)
    window = [0.1 * r / 0.1 for r in ratios[-16:]]
    covered = sum(r <= m.factor + 1e-12 for r in window) / len(window)
    assert 1.0 <= m.factor <= 3.0
    assert covered >= q or m.factor == 3.0


def test_host_work_the_controller_ran_between_two_steps_is_not_overhead() -> None:
    m = SLOMargin()
    m.observe(decode(0, 10.0, 0.05), None)
    m.discount_gap(0.055)  # an adapter install ran before the next step
    m.observe(decode(1, 10.05 + 0.058, 0.05), None)
    assert m.overhead_s == pytest.approx(0.003)
    m.observe(decode(2, 10.158 + 0.004, 0.05), None)  # the discount applied to one gap only
    assert m.overhead_s == pytest.approx(0.004)


def test_inference_factor_prices_steps_without_finetune_rows_apart_from_the_mixed_warmup() -> None:
    m = SLOMargin(min_samples=4)
    assert m.factor == pytest.approx(2.0)  # the warm-up holds mixed steps to half the budget
    for i in range(4):
        m.observe(decode(i, 10.0 + i, 0.011), 0.010)
    assert m.inference_factor == pytest.approx(1.1)
    assert m.factor == pytest.approx(2.0)  # no mixed step ran yet
    m.observe(mixed(9, 20.0, 0.3), 0.1)  # steps with fine-tuning rows do not move the inference factor
    assert m.inference_factor == pytest.approx(1.1)
