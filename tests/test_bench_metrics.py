"""Metrics on hand-computed inputs, and the policies' admission rules on fixed latency models."""

from __future__ import annotations

import csv
import json
import math
from pathlib import Path

import pytest

from deltaserve_core.admission import Admission, AdmissionPolicy, AdmissionReason
from deltaserve_core.bench.metrics import (
    RequestResult,
    StepSample,
    SystemRun,
    percentile,
    step_row,
    summarize,
    timeline,
    write_results,
)
from deltaserve_core.bench.policies import (
    LLMStationAdmission,
    PredictionLog,
    ShapeCacheLatency,
)
from deltaserve_core.finetune_data import InMemoryPool
from deltaserve_core.latency_model import (
    DecodeCoefficients,
    LatencyModel,
    PrefillCoefficients,
)
from deltaserve_core.slo import SLOConfig
from deltaserve_core.types import (
    ExecutionMode,
    FineTuneSample,
    ProposedBatch,
    ScheduledRequest,
    StepRecord,
)


def _req(rid: str, arrival: float, times: tuple[float, ...]) -> RequestResult:
    return RequestResult(rid, arrival, 10, len(times), times)


def test_request_latencies_and_slo() -> None:
    r = _req("a", 1.0, (1.5, 1.6, 1.9))
    assert r.ttft_s == pytest.approx(0.5)
    assert r.tpots_s == pytest.approx((0.1, 0.3))
    assert r.e2e_s == pytest.approx(0.9)
    assert r.meets(0.5, 0.3) and not r.meets(0.4, 0.3) and not r.meets(0.5, 0.25)
    assert not r.meets(0.5, 0.3, avg_tpot_s=0.15) and r.meets(0.5, 0.3, avg_tpot_s=0.2)


def test_summary_on_known_run() -> None:
    reqs = [_req("a", 0.0, (0.2, 0.3)), _req("b", 1.0, (1.1, 1.2, 1.3)), _req("c", 2.0, (3.0, 3.1))]
    steps = [StepSample(0.0, 0.2, True, 0, "eager", 0.25), StepSample(0.5, 0.1, False, 64, "eager", 0.1),
             StepSample(1.0, 0.5, True, 32, "graph", math.nan)]
    run = SystemRun("x", 10.0, reqs, ft_steps=[(2.0, 300), (9.0, 200), (11.0, 999)], steps=steps)
    s = summarize(run, ttft_s=0.5, tpot_s=0.15, dedicated_ft_tok_s=100.0, idle_fraction=0.8)
    assert s["finetune_tokens"] == 500  # the step completing after the window is not counted
    assert s["finetune_tokens_per_s"] == pytest.approx(50.0)
    assert s["inference_tokens_per_s"] == pytest.approx(0.7)
    assert s["slo_attainment"] == pytest.approx(2 / 3)  # c's TTFT is 1.0 s
    assert s["mean_e2e_s"] == pytest.approx((0.3 + 0.3 + 1.1) / 3)
    assert s["p95_e2e_s"] == pytest.approx(percentile([0.3, 0.3, 1.1], 95))
    assert s["estimator_error"] == pytest.approx((0.25 + 0.0) / 2)
    assert s["harvest"] == pytest.approx(50.0 / (100.0 * 0.8))
    assert s["inference_busy_fraction"] == pytest.approx(0.07)
    # step 1 priced 0.25 for 0.2 (inference only), step 2 exact (fine-tuning only), step 3 unpriced but mixed
    assert s["estimator_signed_error_by_kind"] == {"inference_only": {"mean": pytest.approx(0.25), "steps": 1},
                                                   "finetune_only": {"mean": pytest.approx(0.0), "steps": 1}}
    assert s["inference_steps_over_tpot"] == 2 and s["inference_steps_over_tpot_with_finetune"] == 1
    assert percentile([1.0, 2.0, 3.0, 4.0], 50) == pytest.approx(2.5)


def test_timeline_conserves_fine_tuning_tokens_and_tracks_slo() -> None:
    reqs = [_req("a", 0.5, (0.6, 0.7)), _req("b", 3.5, (5.0, 5.1))]
    run = SystemRun("x", 6.0, reqs, ft_steps=[(2.0, 100), (5.0, 60)])
    tl = timeline(run, bin_s=1.0, ttft_s=1.0, tpot_s=1.0, slo_window_s=2.0)
    assert sum(tl["ft_tok_s"]) == pytest.approx(160)
    assert tl["ft_tok_s"][0] == pytest.approx(50) and tl["ft_tok_s"][3] == pytest.approx(20)
    assert sum(tl["inference_tok_s"]) == 4
    assert tl["rolling_slo"][0] == 1.0 and math.isnan(tl["rolling_slo"][2]) and tl["rolling_slo"][3] == 0.0


def test_write_results(tmp_path: Path) -> None:
    result = {"systems": {"a": {"system": "a", "x": 1.0, "y": math.nan, "d": {"k": 1}}}}
    rows = [{"system": "a", "request_id": "r", "ttft_s": 0.1}]
    paths = write_results(tmp_path, "s", result, rows)
    assert json.loads(paths["json"].read_text())["systems"]["a"]["y"] is None
    assert list(csv.DictReader(open(paths["summary_csv"]))) == [{"system": "a", "x": "1.0", "y": "nan"}]
    assert list(csv.DictReader(open(paths["requests_csv"])))[0]["request_id"] == "r"
    assert "steps_csv" not in paths  # no steps, no file
    steps = [step_row("a", StepSample(0.5, 0.2, True, 64, "eager", 0.25, 10, 3, 2, "admitted")),
             step_row("a", StepSample(1.0, 0.1, False, 32, "eager"))]
    paths = write_results(tmp_path, "s", result, rows, steps)
    got = list(csv.DictReader(open(paths["steps_csv"])))
    assert got[0] == {"system": "a", "start_s": "0.5", "duration_s": "0.2", "predicted_s": "0.25", "mode": "eager",
                      "prefill_tokens": "10", "decodes": "3", "ft_rows": "2", "ft_tokens": "64",
                      "ft_reason": "admitted"}
    assert got[1]["predicted_s"] == ""  # unpriced step
    assert got[1]["ft_reason"] == ""  # no co-server decided it


# -------------------------------------------------------------------------------------------- policies


def _model() -> LatencyModel:
    m = LatencyModel()
    m.set_coefficients(ExecutionMode.EAGER, prefill=PrefillCoefficients(0.0, 1e-3, 1e-3, 0.0, 1e-2),
                       decode=DecodeCoefficients(1e-3, 0.0, 1e-2))
    return m


def _pool(n: int = 20, length: int = 10) -> InMemoryPool:
    return InMemoryPool([FineTuneSample(i, tuple(range(1, length + 1)), (False,) + (True,) * (length - 1))
                         for i in range(n)])


def _decode_batch(step: int, now: float = 100.0) -> ProposedBatch:
    reqs = tuple(ScheduledRequest(f"r{i}", 90.0, 0, 50, 3, 95.0, now) for i in range(4))
    return ProposedBatch(step, now, reqs)


def _prefill_batch(step: int, now: float = 100.0) -> ProposedBatch:
    return ProposedBatch(step, now, (ScheduledRequest("p", now, 32),))


def test_shape_cache_interpolates_and_pools_modes() -> None:
    c = ShapeCacheLatency()
    assert c.predict(4, 10) is None
    for mode, d in ((ExecutionMode.GRAPH, 0.01), (ExecutionMode.EAGER, 0.03)):
        c.observe(StepRecord(0, 0.0, d, mode, num_decode=4))
    c.observe(StepRecord(1, 0.0, 0.1, ExecutionMode.EAGER, num_decode=4, finetune_sample_ids=(1,),
                         finetune_lengths=(64,)))
    assert c.predict(4, 0) == pytest.approx(0.02)  # graph and eager in one entry
    assert c.predict(3, 0) == pytest.approx(0.02)  # 3 decodes share the 4-bucket
    assert c.predict(4, 32) == pytest.approx(0.02 + 0.08 * 32 / 64)
    assert c.predict(4, 128) == pytest.approx(0.1 + 0.08 * 64 / 64)
    assert c.predict(64, 64) == pytest.approx(0.1)  # nearest decode bucket answers


def test_llmstation_admits_only_into_decode_steps_within_the_tpot_budget() -> None:
    cache = ShapeCacheLatency()
    cache.observe(StepRecord(0, 0.0, 0.01, ExecutionMode.GRAPH, num_decode=4))
    cache.observe(StepRecord(1, 0.0, 0.05, ExecutionMode.EAGER, num_decode=4, finetune_sample_ids=(1,),
                             finetune_lengths=(64,)))
    adm = LLMStationAdmission(SLOConfig(1.0, 0.03), max_ft_tokens_per_step=1000, cache=cache)
    pool = _pool()
    assert not adm.decide(_prefill_batch(1), pool=pool, buffer_free_tokens=999).samples
    assert not adm.decide(ProposedBatch(2, 0.0, ()), pool=pool, buffer_free_tokens=999).samples
    d = adm.decide(_decode_batch(3), pool=pool, buffer_free_tokens=999)
    # 0.01 + 0.04 * t/64 <= 0.03 -> t <= 32 tokens, buckets round up: 30 tokens -> bucket 32 fits, 40 -> 64 not
    assert [s.sample_id for s in d.samples] == [0, 1, 2]
    assert len(pool) == 17
    # the static budget ignores that the batch's requests already waited since their last token
    late = _decode_batch(4, now=95.0 + 0.029)
    assert adm.decide(late, pool=pool, buffer_free_tokens=999).samples


def test_idle_only_admits_nothing_next_to_inference() -> None:
    slo = SLOConfig(1.0, 0.5)
    adm = Admission(_model(), slo, mixed_batches=True, max_ft_tokens_per_step=100, policy=AdmissionPolicy.idle_only())
    pool = _pool()
    assert not adm.decide(_decode_batch(1), pool=pool, buffer_free_tokens=999).samples
    assert not adm.decide(_prefill_batch(2), pool=pool, buffer_free_tokens=999).samples
    full = Admission(_model(), slo, mixed_batches=True, max_ft_tokens_per_step=100)
    assert full.decide(_decode_batch(3), pool=_pool(), buffer_free_tokens=999).samples
    d = adm.decide(ProposedBatch(4, 100.0, ()), pool=pool, buffer_free_tokens=999)
    assert d.samples and d.predicted_mixed == pytest.approx(_model().predict((), 0, 0, [10] * len(d.samples)))


def test_prediction_log_keeps_what_the_policy_acted_on() -> None:
    model = _model()
    adm = Admission(model, SLOConfig(1.0, 0.5), mixed_batches=True, max_ft_tokens_per_step=30)
    log = PredictionLog(lambda b: -1.0)
    batch = _decode_batch(7)
    d = adm.decide(batch, pool=_pool(), buffer_free_tokens=999)
    log(batch, d)
    assert log.pop(7) == (pytest.approx(d.predicted_mixed), 3)
    batch = _decode_batch(8)
    log(batch, adm.decide(batch, pool=_pool(), buffer_free_tokens=999, hold=AdmissionReason.BACKWARD_RUNNING))
    assert log.pop(8) == (-1.0, 0)  # admission stopped early: the estimator prices the inference batch
    assert log.pop(8) is None


# -------------------------------------------------------------------------------------------- issue 14 metrics


def test_honest_harvest_divides_by_the_trainer_alone_times_the_idle_fraction() -> None:
    from deltaserve_core.bench.metrics import honest_harvest

    assert honest_harvest(600.0, 1000.0, 0.5) == pytest.approx(1.2)
    assert honest_harvest(600.0, None, 0.5) is None and honest_harvest(600.0, 1000.0, 0.0) is None
    run = SystemRun("deltaserve", 10.0, [_req("a", 0.0, (0.1, 0.2))], ft_steps=[(2.0, 1000), (9.0, 2000)])
    assert summarize(run, ttft_s=1.0, tpot_s=1.0, dedicated_ft_tok_s=500.0, idle_fraction=0.4)["harvest"] \
        == pytest.approx(300.0 / (500.0 * 0.4))


def _s(ft: float, slo: float) -> dict:
    return {"finetune_tokens_per_s": ft, "slo_attainment": slo}


def test_headline_takes_the_best_baseline_that_held_100pct_slo() -> None:
    from deltaserve_core.bench.metrics import headline

    summaries = {"bare": _s(0, 1.0), "deltaserve": _s(300, 1.0), "no_interrupt": _s(900, 1.0),  # not a baseline
                 "static_mps@25": _s(100, 1.0), "static_mps@50": _s(200, 1.0), "static_mps@75": _s(350, 0.98),
                 "split_pool@50": _s(120, 1.0), "idle_only": _s(150, 1.0), "llmstation": _s(500, 0.9),
                 "paper_rule": _s(600, 0.5)}
    h = headline(summaries)
    assert h["best_baseline"] == "static_mps@50" and h["ratio"] == pytest.approx(1.5)
    assert h["share_sweep"]["static_mps"] == {"largest_share_at_100pct_slo": 50, "tried": [25, 50, 75]}
    assert h["share_sweep"]["split_pool"]["largest_share_at_100pct_slo"] == 50
    summaries["static_mps@25"]["slo_attainment"] = summaries["static_mps@50"]["slo_attainment"] = 0.99
    summaries["split_pool@50"]["slo_attainment"] = 0.99
    h = headline(summaries)
    assert h["best_baseline"] == "idle_only" and h["ratio"] == pytest.approx(2.0)
    assert h["share_sweep"]["static_mps"]["largest_share_at_100pct_slo"] is None
    summaries["idle_only"]["slo_attainment"] = 0.5
    assert headline(summaries)["ratio"] is None  # nothing to beat: no baseline an operator could run
    zero = {"deltaserve": _s(0, 1.0), "static_mps": _s(0, 1.0)}
    assert headline(zero)["ratio"] is None  # 0 / 0 is no result
    zero["deltaserve"] = _s(5, 1.0)
    assert headline(zero)["ratio"] == math.inf


def test_goals_use_the_regime_target() -> None:
    from deltaserve_core.bench.summary import _goals

    summaries = {"deltaserve": {**_s(300, 1.0), "harvest": 0.75}, "static_mps@50": _s(250, 1.0),
                 "idle_only": _s(310, 1.0)}
    tight = _goals(summaries, "tight")
    assert tight["ft_vs_best_baseline_ge_1.5x"]["met"] is False  # 300 / 310 (idle_only is the best)
    assert tight["ft_vs_best_baseline_ge_1.5x"]["baseline"] == "idle_only"
    assert tight["ft_ge_idle_only"]["met"] is False and tight["harvest_ge_0.7"]["met"] is True
    summaries["idle_only"] = _s(100, 1.0)
    assert _goals(summaries, "paper")["ft_vs_best_baseline_ge_1.0x"]["met"] is True  # 300 / 250


def test_tight_slo_from_the_bare_hosts_inference_steps() -> None:
    from deltaserve_core.bench.metrics import tight_slo

    steps = [StepSample(i * 0.1, 0.001 * (i + 1), True, 0, "eager") for i in range(100)]  # 1..100 ms
    steps.append(StepSample(20.0, 5.0, False, 512, "eager"))  # no inference: not the engine's own step time
    ttft, tpot, why = tight_slo(steps)
    p99 = percentile([0.001 * (i + 1) for i in range(100)], 99)
    assert tpot == pytest.approx(1.25 * p99) and ttft == pytest.approx(tpot * 10 / 3)
    assert why["bare_steps"] == 100 and why["bare_p99_step_s"] == pytest.approx(p99)
    with pytest.raises(ValueError, match="bare"):
        tight_slo([StepSample(0.0, 1.0, False, 10, "eager")])


def test_regimes_and_system_instances() -> None:
    from deltaserve_core.bench.config import BenchConfig, expand_systems, regime_slo

    paper = regime_slo("paper", BenchConfig(), None)
    assert paper[:2] == (0.4, 0.12)
    assert regime_slo("paper", BenchConfig(tpot_s=0.05), None)[:2] == (0.4, 0.05)
    assert regime_slo("auto", BenchConfig(ttft_s=1.0, tpot_s=0.3), None)[:2] == (1.0, 0.3)
    steps = [StepSample(0.0, 0.01, True, 0, "eager")] * 10
    assert regime_slo("tight", BenchConfig(ttft_s=9.0, tpot_s=9.0), None, steps)[1] == pytest.approx(0.0125)
    with pytest.raises(ValueError, match="bare"):
        BenchConfig(systems=("deltaserve",), slo_regimes=("tight",))
    cpu = BenchConfig(systems=("deltaserve", "static_mps", "bare"), static_shares=(25, 50, 75))
    assert cpu.instances == ("bare", "static_mps", "deltaserve")  # no MPS on CPU: one all-cores trainer
    gpu = BenchConfig(device="cuda", systems=("bare", "static_mps", "idle_only"), static_shares=(25, 75))
    assert expand_systems(gpu) == ("bare", "static_mps@25", "static_mps@75", "idle_only")
    with pytest.raises(ValueError, match="split_pool on one GPU"):
        BenchConfig(device="cuda", systems=("split_pool",))
    assert BenchConfig(device="cuda", systems=("split_pool",), split_ft_device="cuda:1").instances == ("split_pool",)
    with pytest.raises(ValueError, match="only static_mps and split_pool"):
        BenchConfig(systems=("deltaserve@50",))


def test_step_recorder_writes_each_steps_reason() -> None:
    from deltaserve_core.bench.replay import _StepRecorder

    reasons = {1: "admitted", 2: "install_pending", 3: "no_slack"}
    asked: list[int] = []

    def reason(step_id: int) -> str | None:
        asked.append(step_id)
        return reasons.pop(step_id, None)

    rec = _StepRecorder(0.0, reasons=reason)
    rec(StepRecord(1, 1.0, 0.1, ExecutionMode.EAGER, num_decode=4, finetune_sample_ids=(7,), finetune_lengths=(9,)))
    rec(StepRecord(2, 1.2, 0.1, ExecutionMode.EAGER, num_decode=4))
    rec(StepRecord(3, 1.4, 0.1, ExecutionMode.EAGER, synthetic=True))  # not kept, but its reason is consumed
    rec(StepRecord(4, 1.6, 0.1, ExecutionMode.EAGER, num_decode=4))  # the co-server gave none
    assert [s.reason for s in rec.steps] == ["admitted", "install_pending", ""]
    assert asked == [1, 2, 3, 4] and not reasons
    assert step_row("deltaserve", rec.steps[1])["ft_reason"] == "install_pending"


def test_every_result_names_the_commit_it_ran_on(monkeypatch: pytest.MonkeyPatch) -> None:
    import subprocess

    from deltaserve_core.bench import source_commit

    monkeypatch.delenv("DELTASERVE_COMMIT", raising=False)
    head = subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True).stdout.strip()
    got = source_commit()
    assert got is not None and got.split("+")[0] == head  # tests run from a clone (CI: a fresh one)
    monkeypatch.setenv("DELTASERVE_COMMIT", "abc1234")  # the GPU machine's copy has no .git: the call passes it
    assert source_commit() == "abc1234"
