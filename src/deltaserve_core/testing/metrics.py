"""Test support for DeltaServe's Prometheus metrics: parse a scraped ``/metrics`` page and check that every
DeltaServe metric is on it with values a running job can have. Shared by the tests of every engine's server;
needs only prometheus_client, which each engine's environment has."""

from __future__ import annotations

import math

from deltaserve_core.metrics import JOB_LABEL, METRICS, RANK_LABEL, exposed_names

__all__ = ["Series", "assert_sane", "parse_exposition"]

#: metric name -> {sorted (label, value) pairs: sample value}
Series = dict[str, dict[tuple[tuple[str, str], ...], float]]


def parse_exposition(text: str) -> Series:
    """Series of a Prometheus text exposition: name -> {sorted labels: value}; names of families without series
    map to an empty dict (their HELP/TYPE lines are there)."""
    from prometheus_client.parser import text_string_to_metric_families

    out: Series = {}
    for family in text_string_to_metric_families(text):
        out.setdefault(family.name + ("_total" if family.type == "counter" else ""), {})
        for s in family.samples:
            out.setdefault(s.name, {})[tuple(sorted(s.labels.items()))] = s.value
    return out


#: gauges without a series until there is a value (no step, publish, priced step or request yet)
_UNTIL_A_VALUE = ("deltaserve_loss", "deltaserve_published_version", "deltaserve_estimator_error_ratio",
                  "deltaserve_slo_attainment_ratio")


def assert_sane(series: Series, job: str, *, trained: bool = True, published: bool = True,
                multiprocess: bool = False, rank: int | None = None) -> None:
    """Every DeltaServe metric is on the page, each series labelled with a job and nothing per request, and ``job``'s
    series (a server may run several jobs) with values a job can have: a ``trained`` one has steps, tokens and a
    finite loss; a ``published`` one a version.

    ``multiprocess``: the page is prometheus_client's multiprocess collector's (SGLang, vLLM with several API
    servers), which knows a metric only from its series, so a gauge without a value yet is not listed at all.
    ``rank``: the job is data-parallel; the series of that rank are checked (every series then carries a rank)."""
    mine = {JOB_LABEL: job} if rank is None else {JOB_LABEL: job, RANK_LABEL: str(rank)}
    missing = set(exposed_names() - set(series))
    if multiprocess:
        wanted = {"deltaserve_loss": trained, "deltaserve_published_version": published}
        missing -= {name for name in _UNTIL_A_VALUE if not wanted.get(name, False)}
    assert not missing, f"not on /metrics: {sorted(missing)}"

    def one(name: str, **labels: str) -> float:
        key = tuple(sorted({**mine, **labels}.items()))
        assert key in series[name], (name, labels, series[name])
        return series[name][key]

    for m in METRICS:
        values = []
        for key, value in series.get(m.name, {}).items():
            labels = dict(key)
            assert JOB_LABEL in labels, (m.name, key)  # every series is some job's; the others' are theirs to check
            if labels[JOB_LABEL] != job:
                continue
            assert set(labels) == set(mine) | ({m.label} if m.label else set()), (m.name, key)
            if m.label:
                assert labels[m.label] in m.values, (m.name, key)
            values.append(value)
        assert all(math.isfinite(v) for v in values), (m.name, values)
        if m.kind == "counter":
            assert all(v >= 0 for v in values), (m.name, values)
    if trained:
        assert one("deltaserve_optimizer_steps_total") >= 1
        assert one("deltaserve_finetune_tokens_total") > 0
        assert one("deltaserve_finetune_forward_tokens_total") >= one("deltaserve_finetune_tokens_total") > 0
        assert one("deltaserve_finetune_samples_total", outcome="completed") > 0
        assert 0 < one("deltaserve_loss") < 100
        assert one("deltaserve_adapter_step") >= 1
        assert 0 < one("deltaserve_data_progress_ratio") <= 1
        assert one("deltaserve_admission_decisions_total", reason="admitted") > 0
        assert one("deltaserve_engine_step_seconds_total", kind="finetune_only") > 0
        assert one("deltaserve_engine_steps_total", kind="finetune_only") > 0
    if published:
        assert one("deltaserve_publishes_total") >= 1
        assert one("deltaserve_published_version") >= 1
    assert one("deltaserve_learning_rate") > 0
    assert one("deltaserve_slo_target_seconds", objective="ttft") > 0
    states = [v for k, v in series["deltaserve_backward_state"].items() if set(mine.items()) <= set(k)]
    assert sum(states) == 1.0, series["deltaserve_backward_state"]
    assert one("deltaserve_training_paused") == 0
    for key, value in series.get("deltaserve_slo_attainment_ratio", {}).items():
        assert 0 <= value <= 1, key
    for key, value in series.get("deltaserve_estimator_error_ratio", {}).items():
        assert value >= 0, key
