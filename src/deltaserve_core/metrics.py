"""Prometheus metrics of a co-serving job, for the engine's own ``/metrics`` endpoint.

One metric set (:data:`METRICS`), the same on every engine. Every series carries the label ``finetune_job`` (the
job's ``adapter_name``; not ``job``, which Prometheus sets on every series to the scrape job's name and would
rename ours to ``exported_job``), a job over several data-parallel replicas also ``dp_rank`` (the replica's rank, so
that N engines behind one ``/metrics`` give N series, never one overwritten by the others; ``sum without(dp_rank)``
is the job's total), and at most one more, whose values are a fixed list (admission reasons, execution modes,
backward states, ...): nothing is labelled per request or per sample, so a server exports a bounded number of
series per job whatever its traffic.

:class:`JobMetrics` turns one :class:`~deltaserve_core.coserve.CoServer` into a :data:`Snapshot` (plain,
JSON-able values). How a snapshot reaches the engine's ``/metrics`` depends on which process serves it:

- the same process (an embedding application's own registry; the tests): a :class:`SnapshotCollector` over
  :meth:`JobMetrics.sample`, in the registry the endpoint renders;
- ``PROMETHEUS_MULTIPROC_DIR`` set where the CoServer runs (SGLang's scheduler under ``--enable-metrics``; vLLM's
  EngineCore when vLLM runs several API servers or the operator set the variable): prometheus_client's own
  multiprocess mode. :class:`MultiprocessSink` keeps ordinary Counter and Gauge objects up to date;
  prometheus_client writes their values into that folder, and the engine's ``MultiProcessCollector`` serves them
  beside its own metrics;
- otherwise (``vllm serve`` by default: one API server with an in-memory registry, the CoServer in the EngineCore
  process): :class:`FileSink` replaces a small JSON file that the API server named, and a SnapshotCollector
  registered in the API server's registry reads it at each scrape (:func:`snapshot_file_collector`); the ranks of a
  data-parallel job each replace their own file beside it (:func:`rank_snapshot_path`).

An :class:`Exporter` thread samples every ``interval_s`` (1 s) off the engine's thread: the step path pays only
for :meth:`JobMetrics.on_step` (a few additions), never for a file write or a registry update.

Counters count what this process did and start at 0 when it starts (Prometheus' convention; ``rate`` and
``increase`` handle the reset of a restart). They never decrease: after a backward restart rewinds to a
checkpoint, the steps and tokens trained again are counted again. Where the job *is* across restarts is the gauge
``deltaserve_adapter_step``: the optimizer step of the adapter, continued from the checkpoint a restart resumed.
"""

from __future__ import annotations

import json
import logging
import math
import os
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from .admission import AdmissionReason
from .hostkit import parse_published_name
from .types import ExecutionMode, StepRecord

if TYPE_CHECKING:
    from .coserve import CoServer

__all__ = ["JOB_LABEL", "METRICS", "RANK_LABEL", "Exporter", "FileSink", "JobLabels", "JobMetrics", "MetricDef",
           "MultiprocessSink", "Snapshot", "SnapshotCollector", "exposed_names", "job_snapshot_path",
           "rank_snapshot_path", "read_snapshot", "render_text", "snapshot_file_collector", "start_exporter"]

log = logging.getLogger("deltaserve.metrics")

#: the label every series carries: the job's adapter name
JOB_LABEL = "finetune_job"
#: the label every series of a data-parallel job carries besides: the replica's rank
RANK_LABEL = "dp_rank"
#: kinds of executed engine steps, by what they carried (the harvest counters' label values)
STEP_KINDS = ("inference", "mixed", "finetune_only")
#: states of the backward side: the backward process's own (``yielding``: waiting for the device while
#: inference steps hold it) and the controller's ``recovering`` (being restarted) and ``dead``
BACKWARD_STATES = ("starting", "idle", "training", "yielding", "saving", "stopped", "recovering", "dead")
_BACKWARD_STATE_OF = {"paused": "yielding"}


@dataclass(frozen=True)
class MetricDef:
    """One metric: ``name`` as exposed (counters end in ``_total``), its type, help text, and its label besides
    :data:`JOB_LABEL` with every value that label takes."""

    name: str
    kind: str  # "counter" or "gauge"
    help: str
    label: str | None = None
    values: tuple[str, ...] = ()


def _c(name: str, help: str, label: str | None = None, values: tuple[str, ...] = ()) -> MetricDef:
    return MetricDef(name, "counter", help, label, values)


def _g(name: str, help: str, label: str | None = None, values: tuple[str, ...] = ()) -> MetricDef:
    return MetricDef(name, "gauge", help, label, values)


METRICS: tuple[MetricDef, ...] = (
    _c("deltaserve_finetune_tokens_total", "Tokens trained by the optimizer steps this process applied"),
    _c("deltaserve_finetune_forward_tokens_total", "Fine-tuning tokens the engine forwarded and captured"),
    _c("deltaserve_optimizer_steps_total", "Optimizer steps this process applied"),
    _c("deltaserve_finetune_samples_total", "Fine-tuning samples whose forward completed or was aborted",
       "outcome", ("completed", "aborted")),
    _c("deltaserve_nonfinite_steps_total", "Optimizer steps skipped because loss, gradients or weights were not finite"),
    _c("deltaserve_redone_steps_total", "Optimizer steps rewound by a backward restart, to be trained again"),
    _c("deltaserve_admission_decisions_total", "Admission decisions, one per engine step, by why they admitted what "
       "they did", "reason", tuple(r.value for r in AdmissionReason)),
    _c("deltaserve_backward_restarts_total", "Restarts of the backward process after it died or hung"),
    _c("deltaserve_checkpoints_total", "Checkpoints written"),
    _c("deltaserve_checkpoint_failures_total", "Checkpoint saves that failed"),
    _c("deltaserve_publishes_total", "Adapter versions published to the engine"),
    _c("deltaserve_publish_failures_total", "Publishes that failed: the folder could not be written, or the adapter "
       "held non-finite values", "reason", ("write", "nonfinite")),
    _c("deltaserve_engine_steps_total", "Engine steps, by what they carried", "kind", STEP_KINDS),
    _c("deltaserve_engine_step_seconds_total", "Measured engine step time, by what the steps carried; "
       "finetune_only is idle time harvested for fine-tuning", "kind", STEP_KINDS),
    _g("deltaserve_adapter_step", "Optimizer step of the job's adapter (continues from the checkpoint after a "
       "restart)"),
    _g("deltaserve_loss", "Training loss of the latest optimizer step"),
    _g("deltaserve_learning_rate", "Learning rate of the optimizer"),
    _g("deltaserve_published_version", "Step of the newest adapter version published"),
    _g("deltaserve_slo_attainment_ratio", "Share of client requests meeting their SLO since start, as the scheduler "
       "sees them (tpot: mean time per output token; both: ttft and tpot)", "objective", ("ttft", "tpot", "both")),
    _g("deltaserve_slo_requests", "Client requests the SLO attainment is computed over"),
    _g("deltaserve_slo_target_seconds", "The job's latency objectives", "objective", ("ttft", "tpot")),
    _g("deltaserve_estimator_error_ratio", "Latency model's mean absolute percentage error over the last 512 "
       "steps, by execution mode", "mode", tuple(m.value for m in ExecutionMode)),
    _g("deltaserve_backward_state", "1 for the backward's current state, 0 for the others", "state",
       BACKWARD_STATES),
    _g("deltaserve_training_paused", "1 while fine-tuning is paused (non-finite steps or failing checkpoint "
       "saves), else 0"),
    _g("deltaserve_data_progress_ratio", "Share of the job's samples (all epochs) trained"),
)

_BY_NAME = {m.name: m for m in METRICS}

#: metric name -> [(label value or None, value)]: what one job's metrics are at one moment (JSON-able)
Snapshot = dict[str, list[tuple[str | None, float]]]
#: the labels every series of one job's snapshot carries (:data:`JOB_LABEL`, and :data:`RANK_LABEL` under data
#: parallelism), in the order they are declared
JobLabels = dict[str, str]


def exposed_names() -> frozenset[str]:
    """Every series name that appears on ``/metrics`` (a dashboard may reference only these)."""
    return frozenset(_BY_NAME)


class JobMetrics:
    """The metric values of one :class:`~deltaserve_core.coserve.CoServer`'s job.

    :meth:`sample` may run on any thread: it reads the controller's stats while the engine's thread updates them,
    and retries when a container changed under it. :meth:`on_step` runs on the engine's thread (it is added to the
    CoServer's ``step_observers``)."""

    def __init__(self, coserver: CoServer) -> None:
        self.co = coserver
        self.job = coserver.job.adapter_name
        self.labels: JobLabels = {JOB_LABEL: self.job}
        if coserver.dp is not None:
            self.labels[RANK_LABEL] = str(coserver.dp.rank)
        self._step_counts = dict.fromkeys(STEP_KINDS, 0)
        self._step_seconds = dict.fromkeys(STEP_KINDS, 0.0)
        #: the highest value each counter series was sampled at: a sample taken while the engine's thread is
        #: half-way through an update (a backward restart's rewind) must not show a counter going down
        self._highest: dict[tuple[str, str | None], float] = {}
        self._lock = threading.Lock()  # samplers: the exporter thread, HTTP threads
        coserver.step_observers.append(self.on_step)

    def on_step(self, record: StepRecord) -> None:
        inference = bool(record.prefill_lengths or record.num_decode)
        finetune = bool(record.finetune_sample_ids or record.aborted_sample_ids)
        if not (inference or finetune):
            return
        kind = "mixed" if inference and finetune else "inference" if inference else "finetune_only"
        self._step_counts[kind] += 1
        self._step_seconds[kind] += max(record.duration_s, 0.0)

    def sample(self) -> Snapshot:
        for _ in range(5):
            try:
                snapshot = self._sample()
                break
            except RuntimeError:  # a dict or deque the engine's thread changed while this one iterated it
                time.sleep(0.001)
        else:
            snapshot = self._sample()
        with self._lock:
            for m in METRICS:
                if m.kind != "counter":
                    continue
                series = []
                for label, value in snapshot[m.name]:
                    value = max(value, self._highest.get((m.name, label), 0.0))
                    self._highest[(m.name, label)] = value
                    series.append((label, value))
                snapshot[m.name] = series
        return snapshot

    def _sample(self) -> Snapshot:
        co, st = self.co, self.co.stats
        reasons = dict(st.admission_reasons)
        attained = co.slo_monitor.attainment()
        backward = self._backward_state()
        out: Snapshot = {
            "deltaserve_finetune_tokens_total": [(None, st.trained_tokens + st.redone_tokens)],
            "deltaserve_finetune_forward_tokens_total": [(None, st.forward_tokens)],
            "deltaserve_optimizer_steps_total": [(None, st.optimizer_steps + st.redone_steps)],
            "deltaserve_finetune_samples_total": [("completed", st.admitted_samples),
                                                  ("aborted", st.aborted_samples)],
            "deltaserve_nonfinite_steps_total": [(None, st.nonfinite_skipped)],
            "deltaserve_redone_steps_total": [(None, st.redone_steps)],
            "deltaserve_admission_decisions_total": [(r, reasons.get(r, 0)) for r in
                                                     _BY_NAME["deltaserve_admission_decisions_total"].values],
            "deltaserve_backward_restarts_total": [(None, st.backward_failures)],
            "deltaserve_checkpoints_total": [(None, len(st.checkpoints))],
            "deltaserve_checkpoint_failures_total": [(None, st.save_failures)],
            "deltaserve_publishes_total": [(None, st.publishes)],
            "deltaserve_publish_failures_total": [("write", st.publish_failures), ("nonfinite", st.publish_refused)],
            "deltaserve_engine_steps_total": list(self._step_counts.items()),
            "deltaserve_engine_step_seconds_total": list(self._step_seconds.items()),
            "deltaserve_adapter_step": [(None, co.adapter_step)],
            "deltaserve_loss": [(None, st.losses[-1])] if st.losses else [],
            "deltaserve_learning_rate": [(None, co.job.lr)],
            "deltaserve_published_version": _published_version(st.published),
            "deltaserve_slo_attainment_ratio": [(k, attained[src]) for k, src in (("ttft", "ttft"), ("tpot", "tpot"),
                                                                                  ("both", "slo"))
                                                if attained[src] is not None],
            "deltaserve_slo_requests": [(None, attained["requests"] or 0)],
            "deltaserve_slo_target_seconds": [("ttft", co.slo.ttft_s), ("tpot", co.slo.tpot_s)],
            "deltaserve_estimator_error_ratio": [(m, v) for m in (e.value for e in ExecutionMode)
                                                 if (v := st.estimator_mape(m)) is not None],
            "deltaserve_backward_state": [(s, float(s == backward)) for s in BACKWARD_STATES],
            "deltaserve_training_paused": [(None, float(bool(st.training_paused or st.paused_reason)))],
            "deltaserve_data_progress_ratio": [(None, co.pool.progress()["fraction"])],
        }
        return {name: [(label, float(value)) for label, value in series] for name, series in out.items()}

    def _backward_state(self) -> str:
        if self.co.recovering:
            return "recovering"
        bw = self.co.backward
        if bw is None:
            return "starting"
        # the child's own state word, in shared memory the controller keeps mapped even after it closed it
        health = bw.health()
        state = _BACKWARD_STATE_OF.get(health.state, health.state)
        if not health.alive and health.exitcode is not None and state != "stopped":
            return "dead"  # until the controller notices and restarts it
        return state if state in BACKWARD_STATES else "starting"


def _published_version(published: list[str]) -> list[tuple[str | None, float]]:
    parsed = parse_published_name(published[-1]) if published else None
    return [(None, float(parsed[1]))] if parsed is not None else []


# ---------------------------------------------------------------------------------------------- collectors


class SnapshotCollector:
    """A prometheus_client collector of one job's metrics, read from ``source`` at each scrape.

    ``source`` returns ``[(labels, snapshot), ...]``: one entry per process of the job (one, or one per
    data-parallel rank, each with its :data:`RANK_LABEL`); an empty list before the first sample (every metric is
    still described, with no series). Register it in the registry the engine's ``/metrics`` renders."""

    def __init__(self, source: Callable[[], list[tuple[JobLabels, Snapshot]]]) -> None:
        self.source = source

    def describe(self) -> Iterator[Any]:
        return iter(self._families([]))

    def collect(self) -> Iterator[Any]:
        try:
            got = self.source()
        except Exception:  # noqa: BLE001 - a scrape must still answer with the engine's own metrics
            log.warning("DeltaServe metrics could not be read", exc_info=True)
            got = []
        return iter(self._families(got))

    @staticmethod
    def _families(got: list[tuple[JobLabels, Snapshot]]) -> list[Any]:
        from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

        # a family's label names are fixed: those of the job's processes (all alike), else the job label alone
        names = list(got[0][0]) if got else [JOB_LABEL]
        families = []
        for m in METRICS:
            family = (CounterMetricFamily if m.kind == "counter" else GaugeMetricFamily)(
                m.name, m.help, labels=names + ([m.label] if m.label else []))
            for labels, snapshot in got:
                for label, value in snapshot.get(m.name, ()):
                    family.add_metric([labels[n] for n in names] + ([label] if m.label else []), value)
            families.append(family)
        return families


def render_text(collector: SnapshotCollector) -> tuple[bytes, str]:
    """The Prometheus text exposition of ``collector`` alone: ``(body, content type)``."""
    from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest

    registry = CollectorRegistry(auto_describe=False)
    registry.register(collector)
    return generate_latest(registry), CONTENT_TYPE_LATEST


# ---------------------------------------------------------------------------------------------- sinks


def rank_snapshot_path(path: str | os.PathLike[str], labels: JobLabels) -> Path:
    """Where the process with ``labels`` writes the snapshots its server named ``path``: ``path`` itself, or for a
    data-parallel rank a file of its own beside it (several EngineCores behind one API server share ``path``)."""
    path = Path(path)
    rank = labels.get(RANK_LABEL)
    return path if rank is None else path.with_name(f"{path.stem}.rank-{rank}{path.suffix}")


class FileSink:
    """Writes each snapshot to ``path`` (replaced atomically: a reader sees the old file or the new one)."""

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self.path = Path(path)

    def write(self, labels: JobLabels, snapshot: Snapshot) -> None:
        tmp = self.path.with_name(f".{self.path.name}.{os.getpid()}.tmp")
        tmp.write_text(json.dumps({"labels": labels, "written_at": time.time(), "metrics": snapshot}))
        os.replace(tmp, self.path)


def job_snapshot_path(path: str | os.PathLike[str], adapter_name: str) -> Path:
    """Where the job ``adapter_name`` of a server that runs several writes the snapshots its server named ``path``:
    a file of its own beside it (the data-parallel ranks of a job, which runs alone, go beside that one in turn)."""
    path = Path(path)
    return path.with_name(f"{path.stem}.job-{adapter_name}{path.suffix}")


def _file_order(path: Path) -> tuple[str, int]:
    head, _, rank = path.stem.rpartition(".rank-")
    return (head, int(rank)) if head and rank.isdigit() else (path.stem, -1)


def read_snapshot(path: str | os.PathLike[str]) -> list[tuple[JobLabels, Snapshot]]:
    """What the :class:`FileSink` of every job and every process of a job last wrote for the server's ``path`` (the
    file, or the jobs' and ranks' files beside it), by job then rank; empty before the first write."""
    path = Path(path)
    files = [path] + sorted(path.parent.glob(f"{path.stem}.*{path.suffix}"), key=_file_order)
    out = []
    for f in files:
        try:
            data = json.loads(f.read_text())
        except FileNotFoundError:
            continue
        out.append((dict(data["labels"]),
                    {k: [(label, float(v)) for label, v in series] for k, series in data["metrics"].items()}))
    return out


def snapshot_file_collector(path: str | os.PathLike[str]) -> SnapshotCollector:
    """The collector of the process that serves ``/metrics`` when the CoServer writes its snapshots to ``path``
    (or, a data-parallel job's ranks, to :func:`rank_snapshot_path` beside it)."""
    return SnapshotCollector(lambda: read_snapshot(path))


class MultiprocessSink:
    """prometheus_client Counter and Gauge objects kept equal to the snapshots, for multiprocess mode
    (``PROMETHEUS_MULTIPROC_DIR``): the values land in that folder, where the serving process's
    ``MultiProcessCollector`` reads them. ``registry``: where the objects are registered (``None``: nowhere;
    in multiprocess mode the folder, not a registry, is what is served)."""

    def __init__(self, label_names: list[str] | None = None, registry: Any = None) -> None:
        from prometheus_client import Counter, Gauge

        self._metrics: dict[str, Any] = {}
        self._names = list(label_names or [JOB_LABEL])  # the job's labels (:attr:`JobMetrics.labels`' keys)
        for m in METRICS:
            labels = self._names + ([m.label] if m.label else [])
            if m.kind == "counter":
                self._metrics[m.name] = Counter(m.name, m.help, labels, registry=registry)
            else:
                # one process writes each series; mostrecent is what SGLang's and vLLM's own gauges use
                self._metrics[m.name] = Gauge(m.name, m.help, labels, registry=registry,
                                              multiprocess_mode="mostrecent")
        self._counted: dict[tuple[str, str | None], float] = {}

    def write(self, labels: JobLabels, snapshot: Snapshot) -> None:
        job = [labels[n] for n in self._names]
        for name, series in snapshot.items():
            metric, m = self._metrics[name], _BY_NAME[name]
            for label, value in series:
                child = metric.labels(*job, label) if m.label else metric.labels(*job)
                if m.kind == "counter":
                    before = self._counted.get((name, label), 0.0)
                    if value > before:  # a prometheus_client counter only takes increments
                        child.inc(value - before)
                        self._counted[(name, label)] = value
                elif math.isfinite(value):
                    child.set(value)


class Exporter:
    """Samples a job's metrics every ``interval_s`` on a daemon thread and hands them to ``sink``; :meth:`close`
    writes a last sample and stops."""

    def __init__(self, metrics: JobMetrics, sink: FileSink | MultiprocessSink, interval_s: float = 1.0) -> None:
        self.metrics = metrics
        self.sink = sink
        self.interval_s = interval_s
        self._stop = threading.Event()
        self._failed = False
        self._thread = threading.Thread(target=self._run, name="deltaserve-metrics", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.wait(self.interval_s):
            self.export()

    def export(self) -> None:
        try:
            self.sink.write(self.metrics.labels, self.metrics.sample())
            self._failed = False
        except Exception:  # noqa: BLE001 - metrics must never take the engine down
            if not self._failed:  # once per outage, not once a second
                log.warning("could not export DeltaServe's metrics", exc_info=True)
            self._failed = True

    def close(self) -> None:
        self._stop.set()
        self._thread.join(5.0)
        self.export()


def start_exporter(coserver: CoServer, *, snapshot_path: str | None = None, interval_s: float = 1.0,
                   environ: Mapping[str, str] | None = None) -> Exporter | None:
    """Export ``coserver``'s metrics from the process it runs in, the way this process's engine serves them:
    prometheus_client's multiprocess folder when ``PROMETHEUS_MULTIPROC_DIR`` is set, else the snapshot file
    ``snapshot_path`` named by the serving process; ``None`` (nothing exported) when neither is."""
    env = os.environ if environ is None else environ
    metrics = JobMetrics(coserver)
    sink: FileSink | MultiprocessSink
    if env.get("PROMETHEUS_MULTIPROC_DIR"):
        sink = MultiprocessSink(list(metrics.labels))
        where = f"prometheus multiprocess folder {env['PROMETHEUS_MULTIPROC_DIR']}"
    elif snapshot_path:
        sink = FileSink(rank_snapshot_path(snapshot_path, metrics.labels))
        where = f"snapshot file {sink.path}"
    else:
        coserver.step_observers.remove(metrics.on_step)
        return None
    log.info("DeltaServe metrics for job %s exported through the %s", metrics.job, where)
    exporter = Exporter(metrics, sink, interval_s)
    exporter.export()  # every series exists from the start, before the first interval
    return exporter
