"""DeltaServe's Prometheus metrics (``deltaserve_core.metrics``): a real CoServer on the reference host exports
every metric with sane values, counters never go down across a backward restart, the snapshot file and the
multiprocess folder carry the same values to the process that serves ``/metrics``, and the Grafana dashboard in
``examples/grafana/`` references only metrics that exist (ours in the metric set, vLLM's in vLLM's source).

The engines' own servers are tested where they run: tests/test_vllm_serve.py (``vllm serve``'s ``/metrics``),
tests/sglang/test_sglang_server.py (SGLang's, under ``--enable-metrics``), tests/test_serve.py
(``deltaserve serve``).
"""

from __future__ import annotations

import importlib.util
import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from deltaserve_core.metrics import JOB_LABEL, METRICS, RANK_LABEL, exposed_names
from deltaserve_core.testing.metrics import assert_sane, parse_exposition
from test_coserve import _drive, _job, _model, dataset, host  # noqa: F401  (the reference host, one per module)

ROOT = Path(__file__).resolve().parents[1]
DASHBOARD = ROOT / "examples" / "grafana" / "deltaserve.json"


# ------------------------------------------------------------------------------------------ a real CoServer


def test_a_coserver_exports_every_metric_and_counters_survive_a_restart(host, dataset: Path,  # noqa: ANN001
                                                                        tmp_path: Path) -> None:
    from deltaserve_core.coserve import CoServer
    from deltaserve_core.driver import ClientRequest
    from deltaserve_core.metrics import (FileSink, JobMetrics, SnapshotCollector, read_snapshot, render_text,
                                         snapshot_file_collector)

    co = CoServer(host, _job(dataset, tmp_path, adapter_name="metered", epochs=3), latency_model=_model(),
                  backward_threads=1)
    with co:
        metrics = JobMetrics(co)
        _drive(host, co, [ClientRequest(f"r{i}", tuple(range(5, 12 + i)), 4) for i in range(3)], until_steps=3)
        while not co.stats.checkpoints:  # the one at step 2, written by the backward process
            co.poll()
            time.sleep(0.01)
        co.flush_host_work()  # its publish
        body, ctype = render_text(SnapshotCollector(lambda: [(metrics.labels, metrics.sample())]))
        assert ctype.startswith("text/plain")
        series = parse_exposition(body.decode())
        assert_sane(series, "metered")
        key = ((JOB_LABEL, "metered"),)
        assert series["deltaserve_optimizer_steps_total"][key] == co.stats.optimizer_steps
        assert series["deltaserve_adapter_step"][key] == co.adapter_step
        assert series["deltaserve_checkpoints_total"][key] == len(co.stats.checkpoints) >= 1
        # the scheduler's sampled view (SLOMonitor): what it counted, whether or not it caught the requests above
        assert series["deltaserve_slo_requests"][key] == co.slo_monitor.attainment()["requests"]
        assert series["deltaserve_backward_state"][((JOB_LABEL, "metered"), ("state", "idle"))] in (0.0, 1.0)

        # the file the vLLM API server reads carries the same values
        sink = FileSink(tmp_path / "metrics.json")
        snapshot = metrics.sample()
        sink.write(metrics.labels, snapshot)
        assert read_snapshot(tmp_path / "metrics.json") == [({JOB_LABEL: "metered"}, snapshot)]
        from_file = parse_exposition(render_text(snapshot_file_collector(tmp_path / "metrics.json"))[0].decode())
        assert set(from_file) == set(series)

        # a backward crash rewinds the adapter to its checkpoint; the counters still only go up
        before = metrics.sample()
        os.kill(co.backward.pid, signal.SIGKILL)
        deadline = time.monotonic() + 120
        while co.stats.backward_failures == 0 or co.recovering:
            assert time.monotonic() < deadline, "the backward process was not restarted"
            co.poll()
            time.sleep(0.01)
        _drive(host, co, [], until_steps=co.stats.optimizer_steps + 1)
        after = metrics.sample()
        for m in METRICS:
            if m.kind == "counter":
                old, new = dict(before[m.name]), dict(after[m.name])
                assert all(new[k] >= v for k, v in old.items()), (m.name, old, new)
        assert dict(after["deltaserve_backward_restarts_total"])[None] == 1
        assert dict(after["deltaserve_optimizer_steps_total"])[None] > dict(before[
            "deltaserve_optimizer_steps_total"])[None]
    # nothing yet: every metric is still described, without series
    empty = parse_exposition(render_text(SnapshotCollector(lambda: []))[0].decode())
    assert set(empty) == exposed_names() and not any(empty.values())


_WRITER = """
import json, sys
from deltaserve_core.metrics import MultiprocessSink
labels = json.loads(sys.argv[2])
sink = MultiprocessSink(list(labels))
for snap in json.loads(sys.argv[1]):
    sink.write(labels, {k: [tuple(s) for s in v] for k, v in snap.items()})
"""


def test_the_multiprocess_sink_writes_what_the_engines_multiprocess_collector_serves(tmp_path: Path) -> None:
    """SGLang (``--enable-metrics``) and vLLM with several API servers serve every process's metrics from
    PROMETHEUS_MULTIPROC_DIR; the sink's values must come out of prometheus_client's own collector there."""
    from prometheus_client import CollectorRegistry, generate_latest
    from prometheus_client.multiprocess import MultiProcessCollector

    first = {"deltaserve_optimizer_steps_total": [[None, 2.0]], "deltaserve_loss": [[None, 1.5]],
             "deltaserve_admission_decisions_total": [["admitted", 5.0], ["no_slack", 1.0]]}
    second = {"deltaserve_optimizer_steps_total": [[None, 3.0]], "deltaserve_loss": [[None, 1.25]],
              "deltaserve_admission_decisions_total": [["admitted", 7.0], ["no_slack", 1.0]]}
    env = dict(os.environ, PROMETHEUS_MULTIPROC_DIR=str(tmp_path))
    run = subprocess.run([sys.executable, "-c", _WRITER, json.dumps([first, second]), json.dumps({JOB_LABEL: "mp-job"})],
                         env=env, capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stderr
    registry = CollectorRegistry()
    MultiProcessCollector(registry, path=str(tmp_path))
    series = parse_exposition(generate_latest(registry).decode())
    job = (JOB_LABEL, "mp-job")
    assert series["deltaserve_optimizer_steps_total"][(job,)] == 3.0  # increments, not a sum of both snapshots
    assert series["deltaserve_loss"][(job,)] == 1.25  # the most recent value
    assert series["deltaserve_admission_decisions_total"][(job, ("reason", "admitted"))] == 7.0

    # two data-parallel ranks, each an engine process of its own: one series each, none overwriting the other
    for rank, snap in ((0, first), (1, second)):
        run = subprocess.run([sys.executable, "-c", _WRITER, json.dumps([snap]),
                              json.dumps({JOB_LABEL: "dp-job", RANK_LABEL: str(rank)})],
                             env=env, capture_output=True, text=True, timeout=120)
        assert run.returncode == 0, run.stderr
    series = parse_exposition(generate_latest(registry).decode())
    ranks = [tuple(sorted({JOB_LABEL: "dp-job", RANK_LABEL: r}.items())) for r in ("0", "1")]
    assert [series["deltaserve_optimizer_steps_total"][k] for k in ranks] == [2.0, 3.0]
    assert [series["deltaserve_loss"][k] for k in ranks] == [1.5, 1.25]


def test_the_ranks_of_a_data_parallel_job_write_one_snapshot_file_each(tmp_path: Path) -> None:
    """vLLM with ``--data-parallel-size N --api-server-count 1``: N EngineCores, one API server reading the file it
    named. Each rank replaces a file of its own beside it; the collector serves every rank's series."""
    from deltaserve_core.metrics import FileSink, rank_snapshot_path, render_text, snapshot_file_collector

    path = tmp_path / "metrics.json"
    for rank, steps in ((1, 3.0), (0, 2.0)):
        labels = {JOB_LABEL: "dp-job", RANK_LABEL: str(rank)}
        FileSink(rank_snapshot_path(path, labels)).write(labels, {"deltaserve_optimizer_steps_total": [(None, steps)],
                                                                  "deltaserve_loss": [(None, steps / 2)]})
    assert not path.exists() and rank_snapshot_path(path, {JOB_LABEL: "one"}) == path
    series = parse_exposition(render_text(snapshot_file_collector(path))[0].decode())
    ranks = [tuple(sorted({JOB_LABEL: "dp-job", RANK_LABEL: r}.items())) for r in ("0", "1")]
    assert [series["deltaserve_optimizer_steps_total"][k] for k in ranks] == [2.0, 3.0]
    assert [series["deltaserve_loss"][k] for k in ranks] == [1.0, 1.5]


# ------------------------------------------------------------------------------------------ the dashboard


_METRIC_NAME = re.compile(r"(?<![A-Za-z0-9_:])(deltaserve_[a-z0-9_]+|vllm:[a-z0-9_:]+)(\s*\{([^}]*)\})?")
_MATCHER = re.compile(r"\s*([A-Za-z_][A-Za-z0-9_]*)\s*(=~|!~|!=|=)\s*\"((?:[^\"\\]|\\.)*)\"\s*,?")
_SUFFIXES = ("_bucket", "_sum", "_count", "_total", "_created")


_GROUPING = re.compile(r"\b(?:by|without)\s*\(([^)]*)\)")
_LEGEND = re.compile(r"\{\{\s*([A-Za-z_][A-Za-z0-9_]*)\s*\}\}")


def _targets(node: object) -> list[tuple[str, str]]:
    """(PromQL, legend) of every query in a dashboard: panel targets and templating variables."""
    if isinstance(node, dict):
        found = [(node["expr"], node.get("legendFormat", ""))] if isinstance(node.get("expr"), str) else []
        if isinstance(node.get("query"), str) and node.get("refId") is not None or "definition" in node:
            found.append((node["definition"] if "definition" in node else node["query"], ""))
        return found + [t for v in node.values() for t in _targets(v)]
    if isinstance(node, list):
        return [t for v in node for t in _targets(v)]
    return []


def _vllm_metric_names() -> set[str] | None:
    spec = importlib.util.find_spec("vllm")
    if spec is None or not spec.submodule_search_locations:
        return None
    root = Path(next(iter(spec.submodule_search_locations)))
    names: set[str] = set()
    for path in (root / "v1" / "metrics").glob("*.py"):
        names |= set(re.findall(r"[\"'](vllm:[a-z0-9_:]+)[\"']", path.read_text()))
    return names


def test_the_grafana_dashboard_references_only_metrics_that_exist() -> None:
    board = json.loads(DASHBOARD.read_text())
    assert board.get("panels") and board.get("title"), "not a Grafana dashboard"
    targets = _targets(board)
    assert targets, "the dashboard has no queries"
    ours = {m.name: m for m in METRICS}
    used: set[str] = set()
    vllm_used: set[str] = set()
    for expr, legend in targets:
        assert expr.count("(") == expr.count(")") and expr.count("{") == expr.count("}"), expr
        found = _METRIC_NAME.findall(expr)
        assert found, f"{expr!r} references no DeltaServe or vLLM metric"
        available: set[str] = set()
        for name, _, matchers in found:
            labels = {m.group(1) for m in _MATCHER.finditer(matchers)} if matchers else set()
            if name.startswith("deltaserve_"):
                assert name in ours, f"{name} (in {expr!r}) is not a DeltaServe metric"
                allowed = {JOB_LABEL, *([ours[name].label] if ours[name].label else [])}
                assert labels <= allowed, f"{expr!r}: {name} has labels {sorted(allowed)}, not {sorted(labels)}"
                available |= allowed
                used.add(name)
            else:
                vllm_used.add(name)
        if all(name.startswith("deltaserve_") for name, _, _ in found):
            # grouping and legend labels must be labels the series have, or the panel shows one blank line
            grouped = {g.strip() for group in _GROUPING.findall(expr) for g in group.split(",") if g.strip()}
            shown = set(_LEGEND.findall(legend))
            assert grouped | shown <= available, f"{expr!r} / {legend!r}: only {sorted(available)} exist"
    assert used == set(ours), f"metrics the dashboard does not show: {sorted(set(ours) - used)}"
    vllm_names = _vllm_metric_names()
    if vllm_names is None:
        pytest.skip("vLLM is not installed: its metric names cannot be checked")
    for name in vllm_used:
        base = next((name[: -len(s)] for s in _SUFFIXES if name.endswith(s)), name)
        assert base in vllm_names or name in vllm_names, f"{name} is not a metric of the installed vLLM"
    assert vllm_used, "the dashboard shows no vLLM metric beside DeltaServe's"
