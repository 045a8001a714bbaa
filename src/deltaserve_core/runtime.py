"""One engine runtime: the fine-tuning jobs inside an engine's own server process, the same on every engine.

Under ``vllm serve``, SGLang's server and S-LoRA's server, DeltaServe runs in the engine process that steps the
model (vLLM's EngineCore, SGLang's scheduler, S-LoRA's router). What happens there does not depend on the engine
and lives here: the jobs are loaded (the job file's, and those created over HTTP that a restart resumes), their
publish folders made, the latency model chosen by one policy, each job's
:class:`~deltaserve_core.coserve.CoServer` built on one :class:`~deltaserve_core.job_sharing.JobSharing` and
started, their metrics exported, the jobs API answered (a create adds a job while others train, up to
``jobs.max_concurrent``), and a stop turned into final checkpoints within the time the engine's server waits for
them. An adapter's serving module builds its host (the engine translation) and says what its engine allows: whether
calibration can run in place, how a stop reaches the engine's loop, what to clean up.

The latency-model policy: the stored calibration profile of this host (same model path, dtype and device) when
there is one. Without one, the host is calibrated in place, with progress, where the engine lets DeltaServe step
it before the serving loop starts (SGLang); where the serving loop owns every step from the start (vLLM's
EngineCore, S-LoRA's router), start-up stops with the one command that stores a profile. Every job has a model of
its own (each refits it from the steps it sees): a job that joins loads the stored profile, else copies the model
of a job already running.
"""
from __future__ import annotations

import copy
import logging
import signal
import threading
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from .hooks import HostHooks
from .hostkit import publish_dir
from .job_config import JobConfig, JobConfigError, load_job_config
from .job_control import JobCallError, job_call
from .job_create import (CreatedJob, JobsSettings, config_error, current_suffix, forget_created, job_from_request,
                         operator_state, save_created, save_operator_state)
from .job_prepare import PreparingJob
from .job_sharing import JobSharing

if TYPE_CHECKING:
    from .calibration import CalibrationProfile, ProfileKey
    from .latency_model import LatencyModel

__all__ = ["EngineRuntime", "MissingCalibrationError", "route_logs", "stored_latency_model", "stored_profile"]

log = logging.getLogger("deltaserve.runtime")


class MissingCalibrationError(RuntimeError):
    """No stored latency profile for this host, and its engine cannot be calibrated in place."""


def stored_profile(key: ProfileKey, calibrate_command: str) -> CalibrationProfile:
    """The stored calibration profile under ``key``, or :class:`MissingCalibrationError` naming the command that
    stores one (``calibrate_command``, with the same model path, dtype and device)."""
    from .calibration import ProfileStore

    store = ProfileStore()
    profile = store.load(key)
    if profile is None:
        raise MissingCalibrationError(
            f"no latency-model calibration for {key.host} {key.engine_version} / {key.model} on {key.device} "
            f"({key.dtype}) in {store.root}: run `{calibrate_command}` first (same model path; "
            "DELTASERVE_PROFILE_DIR selects the store)")
    return profile


def stored_latency_model(host: HostHooks, calibrate_command: str) -> LatencyModel:
    """:func:`stored_profile`'s model for ``host``'s profile key."""
    from .calibration import ProfileKey

    return stored_profile(ProfileKey.for_host(host), calibrate_command).model


def route_logs(handlers: Iterable[logging.Handler], names: Iterable[str] = ("deltaserve",)) -> None:
    """Send DeltaServe's log lines (progress, publishing, faults) through the engine's own handlers, so they
    appear in the server's output in its format; engines configure only their own loggers."""
    handlers = list(handlers)
    for name in names:
        ours = logging.getLogger(name)
        if ours.handlers:
            continue
        for handler in handlers:
            ours.addHandler(handler)
        ours.setLevel(logging.INFO)
        ours.propagate = False


class _EndedJob:
    """What the jobs API still answers for a job that ended and was removed from the host to make room for a new
    one: its last status, events and checkpoints (its files stay on disk)."""

    def __init__(self, co: Any) -> None:
        co.refresh()
        self.job_id: str = co.job_id
        self.events = co.events
        self.job = co.job
        self._status = co.job_status()
        self._checkpoints = co.job_checkpoints()

    def refresh(self) -> None:
        pass

    def job_status(self) -> dict[str, Any]:
        return dict(self._status)

    def job_checkpoints(self) -> list[dict[str, Any]]:
        return list(self._checkpoints)

    def _refuse(self, op: str) -> dict[str, Any]:
        raise JobCallError(409, f"cannot {op} job {self.job_id}: it is {self._status['status']}",
                           code="job_not_active", param="id")

    def pause(self) -> dict[str, Any]:
        return self._refuse("pause")

    def resume(self) -> dict[str, Any]:
        return self._refuse("resume")

    def cancel(self) -> dict[str, Any]:
        return self.job_status() if self._status["status"] == "cancelled" else self._refuse("cancel")


_ENDED = ("succeeded", "failed", "cancelled")
StartupJobs = Sequence[tuple[JobConfig, CreatedJob | None]]


class EngineRuntime:
    """The fine-tuning jobs of one engine server process, from the job files to their final checkpoints: the job
    the server was started with, the jobs created over HTTP, and the jobs a restart resumes, all on one
    :class:`~deltaserve_core.job_sharing.JobSharing` (also when there is one job: one code path; a job alone holds
    the fine-tuning rows at every step, as a CoServer alone on the host would).

    Lifecycle: construct (jobs loaded, publish folders made) -> :meth:`start` with the adapter's host (the
    JobSharing installed, every startup job started, a paused one paused again) -> :meth:`job_call` for the jobs
    API (a create starts another job while up to ``jobs.max_concurrent`` are active) -> :meth:`begin_stop` (from a
    signal handler or the engine's own shutdown request) -> :meth:`stop` (final checkpoints, then cleanup).
    ``grace_s``: how long the engine's server waits for this process after it asked it to stop; :meth:`stop`
    spends at most half of what is left on each job's shutdown, so the saves still fit."""

    def __init__(self, job: JobConfig | str | Path | None, *, engine: str, grace_s: float, log_every_s: float = 10.0,
                 where: str | None = None, dp_rank: int | None = None, jobs: JobsSettings | None = None,
                 created: CreatedJob | None = None, served_models: tuple[str, ...] = (), engines: int = 1,
                 startup: StartupJobs | None = None) -> None:
        """``engine``: the host's short name; ``where``: the process, as the start line names it; ``dp_rank``: this
        engine's rank in a data-parallel job (None for a job of one replica).

        ``job``: the job to start with (None: none until one is created, which needs ``jobs``); ``jobs``: the
        operator's settings for jobs created over HTTP; ``created``: ``job``'s record when it was created over HTTP;
        ``startup``: every job to start with and its record (:func:`~deltaserve_core.job_create.startup_jobs`), in
        place of ``job`` and ``created``; ``served_models``: the names a create's ``model`` may give (the first is
        named in refusals); ``engines``: how many engines of this server run the job (a create reaches only one
        job of one engine, so it is refused for more)."""
        if startup is None:
            first = job if isinstance(job, JobConfig) or job is None else load_job_config(job)
            startup = [(first, created)] if first is not None else []
        if not startup and jobs is None:
            raise ValueError("EngineRuntime needs a job, or the jobs settings under which one can be created")
        self._startup: list[tuple[JobConfig, dict[str, Any] | None]] = [
            (j, c.record if c is not None else None) for j, c in startup]
        #: the first job (the job file's, else the oldest resumed); the host's scratch space and first publish
        #: folder are its
        self.job: JobConfig | None = self._startup[0][0] if self._startup else None
        self.jobs = jobs
        self.served_models = served_models
        self.engines = engines
        self.engine = engine
        self.dp_rank = dp_rank
        self.where = where or f"the {engine} engine"
        if dp_rank is not None:
            self.where += f" of data-parallel rank {dp_rank}"
        if engines > 1 and len(self._startup) > 1:
            raise ValueError("a data-parallel server runs one job; remove the created jobs from its jobs folder")
        self.grace_s = float(grace_s)
        self.log_every_s = float(log_every_s)
        self.publish_root: Path | None = None
        for j, _ in self._startup:
            publish_dir(j).mkdir(parents=True, exist_ok=True)
        if self.job is not None:
            self.publish_root = publish_dir(self.job)
        #: scratch space of the engine's host (the reserved adapter's folder); removed at stop. The ranks of a
        #: data-parallel job share checkpoint.dir, so each rank has its own.
        rank = "" if dp_rank is None else f"-rank-{dp_rank}"
        scratch = Path(self.job.checkpoint.dir) if self.job is not None else jobs.dir  # type: ignore[union-attr]
        self.work_dir = scratch / f".serve-{engine}{rank}"
        self.host: HostHooks | None = None
        self.sharing: JobSharing | None = None
        #: every job of this run by id, in the order they started: a CoServer on the sharing, or what is left of one
        #: that ended and was removed (:class:`_EndedJob`)
        self._known: dict[str, Any] = {}
        self._records: dict[str, dict[str, Any]] = {}  # a created job's create record, by job id
        self._exporters: dict[str, Any] = {}  # each job's metrics exporter, by job id
        self._ended_noted: set[str] = set()  # jobs whose end is recorded for a restart
        self._start_options: dict[str, Any] = {}
        self._cleanups: list[Callable[[], None]] = []
        self._on_begin_stop: list[Callable[[], None]] = []
        self._stop_signalled_at: float | None = None
        self._stopped = False
        self._lock = threading.Lock()

    @property
    def coservers(self) -> tuple[Any, ...]:
        """The jobs on the host now (running, paused, or ended but not yet removed), in the order they started."""
        return self.sharing.jobs if self.sharing is not None else ()

    @property
    def coserver(self) -> Any:
        """The newest job on the host (None: none): what an adapter that runs one job at a time drives."""
        jobs = self.coservers
        return jobs[-1] if jobs else None

    # ------------------------------------------------------------------------------------ start

    def start(self, host: HostHooks, *, calibration: Mapping[str, Any] | None = None,
              calibrate_command: str | None = None, latency_model: LatencyModel | None = None,
              metrics: bool = True, metrics_snapshot: str | None = None, **coserver_options: Any) -> None:
        """Install the job sharing on ``host`` and start every startup job.

        ``calibration``: the engine can be calibrated in place now (settings for
        :func:`~deltaserve_core.calibration.load_or_calibrate`); otherwise ``calibrate_command`` is the command
        that stores a profile, named when none is stored (or ``latency_model``: the stored one, already loaded by
        an adapter that must refuse before it patches anything). ``metrics``: export each job's metrics the way
        this engine's server serves them (:func:`deltaserve_core.metrics.start_exporter`). Without a job the
        host only waits for one to be created."""
        if calibration is None and calibrate_command is None and latency_model is None:
            raise ValueError("EngineRuntime.start needs calibration settings or the command that calibrates")
        self.host = host
        self._start_options = {"calibrate_command": calibrate_command, "metrics": metrics,
                               "metrics_snapshot": metrics_snapshot, "coserver_options": coserver_options}
        self.sharing = JobSharing(host).start()
        if not self._startup:
            log.info("DeltaServe started in %s without a fine-tuning job: create one with POST /v1/fine_tuning/jobs "
                     "(training files from %s)", self.where, self.jobs.data_dir if self.jobs else None)
            return
        for i, (job, record) in enumerate(self._startup):
            if i == 0:  # the first job calibrates in place when the engine allows it and no profile is stored
                latency = latency_model
                if latency is None and calibration is None:
                    latency = stored_latency_model(host, calibrate_command or "")
                settings = dict(calibration or {})
                settings.setdefault("progress", True)
                co = self._add_job(job, latency, settings if latency is None else None)
            else:
                co = self._add_job(job, self._latency_for_new_job(), None)
            self._run_job(co, record)
            if operator_state(job).get("paused") and co.job_status()["status"] not in _ENDED:
                co.pause()
                co.events.add("info", "kept paused across the restart: resume it to train again")

    def _add_job(self, job: JobConfig, latency: LatencyModel | None, calibration: Mapping[str, Any] | None) -> Any:
        assert self.sharing is not None
        return self.sharing.add(job, **self._job_options(latency, calibration))

    def _job_options(self, latency: LatencyModel | None, calibration: Mapping[str, Any] | None) -> dict[str, Any]:
        return dict(latency_model=latency, calibration=calibration, log_every_s=self.log_every_s,
                    dp_rank=self.dp_rank, **self._start_options["coserver_options"])

    def _run_job(self, co: Any, record: dict[str, Any] | None, begin: Callable[[], Any] | None = None) -> None:
        """Start ``co`` (``begin``: how, default its ``start()``; forgotten again if that fails) and export its
        metrics."""
        assert self.sharing is not None
        try:
            (begin or co.start)()
        except BaseException:
            self.sharing.remove(co)
            raise
        self._known[co.job_id] = co
        if record is not None:
            self._records[co.job_id] = record
        if self._start_options["metrics"]:
            from .metrics import job_snapshot_path, start_exporter

            snapshot = self._start_options["metrics_snapshot"]
            exporter = start_exporter(co, snapshot_path=job_snapshot_path(snapshot, co.job.adapter_name)
                                      if snapshot else None)
            if exporter is not None:
                self._exporters[co.job_id] = exporter
        job = co.job
        log.info("DeltaServe co-serving started in %s: job %s, dataset %s, adapter %s, checkpoints in %s",
                 self.where, co.job_id, job.dataset, job.adapter_name, job.checkpoint.dir)

    @property
    def metrics(self) -> Any:
        """The newest job's metrics exporter (None: its metrics are not exported)."""
        co = self.coserver
        return self._exporters.get(co.job_id) if co is not None else None

    def preflight_job(self, job: JobConfig) -> None:
        """What the server's start-up checks of a job file, for a created job (raises
        :class:`~deltaserve_core.job_config.JobConfigError`): an adapter adds its engine's limits. Writes nothing
        (the checkpoint folder is made when the job starts), so a refused create leaves no trace."""
        from .preflight import check_job

        check_job(job, self.host.model_spec().path if self.host is not None else None)

    # ------------------------------------------------------------------------------------ the jobs API

    def job_call(self, op: str, args: dict[str, Any] | None = None) -> dict[str, Any]:
        """One jobs-API call against this engine's jobs (:func:`~deltaserve_core.job_control.job_call`'s answer
        shape), ``create`` included; runs on the thread that drives the engine's steps. A pause, resume or cancel
        is kept beside the job's checkpoints, so a restart leaves the job as the operator did."""
        if op == "create":
            try:
                return {"result": self._annotated(self._create((args or {}).get("body")))}
            except JobCallError as exc:
                return exc.as_dict()
        answer = job_call(list(self._known.values()), op, args)
        if "result" in answer:
            result = answer["result"]
            if op in ("pause", "resume", "cancel"):
                self._keep_operator_state(self._known[result["id"]], op, result["status"])
            for job in result if isinstance(result, list) else [result]:
                self._note_if_ended(job)
            answer["result"] = ([self._annotated(j) for j in result] if isinstance(result, list)
                                else self._annotated(result))
        return answer

    def _keep_operator_state(self, co: Any, op: str, status: str) -> None:
        try:
            # a cancel is final from the request on: a restart before its checkpoint lands must not train on
            save_operator_state(co.job, paused=status == "paused", ended="cancelled" if op == "cancel" else None)
        except OSError as exc:  # the call itself took effect; only a restart would not know it
            log.warning("DeltaServe: could not keep job %s's state for a restart: %s", co.job_id, exc)

    def _annotated(self, result: Any) -> Any:
        """A job object with what only its create request said (its metadata; its creation time, kept across
        restarts)."""
        if not isinstance(result, dict) or result.get("object") != "fine_tuning.job":
            return result
        record = self._records.get(result.get("id"))  # type: ignore[arg-type]
        result["metadata"] = record.get("metadata") if record else None
        if record:
            result["created_at"] = record["created_at"]
            result["user_provided_suffix"] = record["suffix"]
        return result

    def _active(self) -> list[Any]:
        """The jobs that count against ``jobs.max_concurrent``: every one not succeeded, failed or cancelled, those
        still being prepared included (each will hold a backward process and its memory)."""
        out = []
        for co in self._known.values():
            co.refresh()
            if co.job_status()["status"] not in _ENDED:
                out.append(co)
        return out

    def _create(self, body: Any) -> dict[str, Any]:
        if self.jobs is None or self.jobs.data_dir is None:
            raise JobCallError(403, "this server does not create fine-tuning jobs over HTTP: no data directory is "
                               "set for training files; " + ((self.jobs.how_to_enable if self.jobs else "")
                               or "start the server with the jobs data_dir setting"),
                               code="job_creation_disabled")
        if self.dp_rank is not None or self.engines > 1:
            raise JobCallError(501, "creating a job over HTTP is not offered under data parallelism yet: declare the "
                               "job in the job file the server starts with (docs/scaling.md)",
                               code="create_unsupported_data_parallel")
        if self.stopping or self.sharing is None:
            raise JobCallError(503, "the server is stopping", type="service_unavailable", code="server_stopping")
        active = self._active()
        limit = self.jobs.max_concurrent
        if len(active) >= limit:
            ids = ", ".join(f"{co.job_id} ({co.job_status()['status']})" for co in active)
            setting = self.jobs.limit_setting
            raise JobCallError(409, f"{len(active)} fine-tuning job(s) active on this server ({ids}) and {setting} "
                               f"is {limit}: cancel one (POST /v1/fine_tuning/jobs/<id>/cancel), wait for one to end, "
                               f"or start the server with a higher {setting}", code="job_limit_reached")
        created = job_from_request(body, self.jobs, served_models=self.served_models,
                                   taken=tuple(k.job.adapter_name for k in self._known.values()))
        try:
            self.preflight_job(created.job)
        except JobConfigError as exc:
            raise config_error(exc) from None
        self._drop_ended()  # their backward processes go; what the API shows of them stays
        latency = self._latency_for_new_job()  # here: a running job's model is refit on this thread
        previous = current_suffix(self.jobs)
        save_created(created, self.jobs)  # a restart while it is prepared starts it, as any accepted job
        sharing = self.sharing

        def build() -> Any:  # on the job's own thread: the dataset loads and tokenises there
            try:
                return sharing.build(created.job, **self._job_options(latency, None))
            except (ValueError, OSError) as exc:  # JobConfigError included: a bad dataset is the client's error
                raise JobCallError(400, f"training_file: not a usable dataset: {exc}", code="invalid_training_file",
                                   param="training_file") from None

        model = self.host.model_spec().path if self.host is not None else ""
        prep = PreparingJob(created, model, build=build,
                            done=lambda p: sharing.hand_over(lambda: self._prepared(p, previous)))
        self._known[prep.job_id] = prep
        self._records[prep.job_id] = created.record
        prep.events.add("info", f"created over HTTP (training file {created.record['training_file']}): validating "
                                "it and starting the job's backward process, beside the engine's steps")
        prep.start()
        return prep.job_status()

    def _prepared(self, prep: PreparingJob, previous: str | None) -> None:
        """On the engine's thread, once ``prep``'s thread has ended: a prepared job joins the host and runs (the
        runtime answers for its CoServer from now on); a failed one leaves no trace on disk, so a restart does not
        try it again (the API still shows it failed until then)."""
        assert self.sharing is not None and self.jobs is not None
        created = CreatedJob(prep.job, prep.record)
        if prep.state == "ready" and self.stopping:
            prep.abandon(stopping=True)  # released; not run now, it is prepared again at the next start
        elif prep.state == "ready":
            co = prep.co
            try:
                self.sharing.join(co)  # type: ignore[arg-type]
                self._run_job(co, prep.record, begin=co.attach)  # type: ignore[union-attr]
            except Exception as exc:  # noqa: BLE001 - the job fails; the engine, its inference and other jobs go on
                log.exception("DeltaServe: the created job %s did not start", prep.job_id)
                prep.fail({"code": "job_start_failed", "message": f"job {prep.job_id} did not start: {exc}",
                           "param": None})
            else:
                prep.attached()
                self._known[prep.job_id] = co  # in its place: the list keeps the order jobs were created in
                return
        if prep.state == "failed":
            self._ended_noted.add(prep.job_id)  # nothing may write into the folder that goes now
            forget_created(created, self.jobs, previous)

    def _drop_ended(self) -> None:
        """Remove the jobs that ended from the host (their final checkpoints are written); the API keeps answering
        for them from what they last said."""
        assert self.sharing is not None
        for co in self.sharing.jobs:
            co.refresh()
            status = co.job_status()["status"]
            if status not in _ENDED:
                continue
            self._known[co.job_id] = _EndedJob(co)
            self._keep_ended(co, status)
            exporter = self._exporters.pop(co.job_id, None)
            if exporter is not None:
                exporter.close()  # its final values stay on /metrics
            self.sharing.remove(co)

    def _note_if_ended(self, job: Any) -> None:
        """Record a job seen ended (a crash before the stop's own record then does not start it again)."""
        if isinstance(job, dict) and job.get("status") in _ENDED and job.get("id") not in self._ended_noted:
            co = self._known.get(job["id"])
            if co is not None:
                self._keep_ended(co, job["status"])

    def _keep_ended(self, co: Any, status: str) -> None:
        self._ended_noted.add(co.job_id)
        try:
            save_operator_state(co.job, paused=False, ended=status)
        except OSError as exc:
            log.warning("DeltaServe: could not record that job %s is %s: %s", co.job_id, status, exc)

    def _latency_for_new_job(self) -> LatencyModel:
        """A latency model of its own for a job that joins: the stored profile of this host, else a copy of the
        model a running job has refit (each job refits its own from every step record)."""
        host: Any = self.host
        command = (self._start_options["calibrate_command"]
                   or f"deltaserve calibrate --host {self.engine} --model {host.model_spec().path}")
        try:
            return stored_latency_model(host, command)
        except MissingCalibrationError as exc:
            if self.coservers:
                return copy.deepcopy(self.coservers[-1].model)
            raise JobCallError(409, str(exc), code="calibration_missing") from None

    def on_begin_stop(self, fn: Callable[[], None]) -> None:
        """Also run ``fn`` when a stop begins (it must only set flags: it may run in a signal handler)."""
        self._on_begin_stop.append(fn)

    def on_stop(self, fn: Callable[[], None]) -> None:
        """Run ``fn`` after the final checkpoint (cleanup of the engine side), last added first."""
        self._cleanups.append(fn)

    @property
    def stopping(self) -> bool:
        return self._stop_signalled_at is not None or self._stopped

    @property
    def wants_steps(self) -> bool:
        """Whether the engine's loop should keep stepping for its jobs (fine-tuning-only steps)."""
        return not self.stopping and self.sharing is not None and (bool(self.sharing.wants_steps)
                                                                   or bool(self._preparing()))

    def _preparing(self) -> list[PreparingJob]:
        """The created jobs whose preparation has not ended (the engine must keep stepping to take them over)."""
        return [j for j in self._known.values() if isinstance(j, PreparingJob) and j.state in ("preparing", "ready")]

    # ------------------------------------------------------------------------------------ stop

    def catch_stop_signals(self, *, chain: bool) -> None:
        """Begin a stop on SIGINT/SIGTERM. ``chain``: then call the engine's own handler (vLLM's EngineCore
        leaves its loop by it); otherwise the engine's loop ends through :meth:`on_begin_stop` callbacks, and
        Python's defaults (KeyboardInterrupt anywhere, or death) never cut a step or the save short."""
        if threading.current_thread() is not threading.main_thread():
            log.warning("DeltaServe runtime started off the main thread: a stop signal will not pause fine-tuning "
                        "before the engine stops, nor write a final checkpoint first")
            return
        for signum in (signal.SIGINT, signal.SIGTERM):
            previous = signal.getsignal(signum) if chain else None

            def handler(num: int, frame: Any, previous: Any = previous) -> None:
                self.begin_stop()
                if callable(previous):
                    previous(num, frame)
                elif chain and previous == signal.SIG_DFL:
                    raise SystemExit(128 + num)

            signal.signal(signum, handler)

    def begin_stop(self) -> None:
        """Admit no more fine-tuning and let the engine's loop end; the final checkpoint follows in :meth:`stop`.
        Only sets flags: it runs in a signal handler."""
        if self._stop_signalled_at is None:
            self._stop_signalled_at = time.monotonic()
        for co in self.coservers:
            co.stop_admission()
        for fn in self._on_begin_stop:
            fn()

    def stop_timeout_s(self) -> float:
        """Half of what is left of the grace since the stop was signalled (all of it when none was): a backward
        batch that runs over is cancelled, and the save still fits."""
        started = self._stop_signalled_at if self._stop_signalled_at is not None else time.monotonic()
        return max(1.0, (self.grace_s - (time.monotonic() - started)) * 0.5)

    def stop(self) -> None:
        """The final checkpoint, within the grace; then the adapter's cleanups. Once."""
        with self._lock:
            if self._stopped:
                return
            self._stopped = True
        if threading.current_thread() is threading.main_thread():
            # A Ctrl-C reaches this process once directly and again from the engine's server (or systemd signals
            # the whole group): the default action of the second one would kill it mid-checkpoint. The server's
            # SIGKILL after its grace still bounds the stop.
            for signum in (signal.SIGINT, signal.SIGTERM):
                signal.signal(signum, signal.SIG_IGN)
        try:
            preparing = self._preparing()
            for prep in preparing:  # a started backward process is killed: the job resumes at the next start
                prep.abandon(stopping=True)
            for prep in preparing:
                if not prep.wait(self.stop_timeout_s()):
                    log.warning("DeltaServe: job %s was still being prepared when the server stopped", prep.job_id)
            for co in self.coservers:
                co.stop_admission()
            for co in self.coservers:
                # read before the shutdown closes its backward, after which it can no longer tell it finished
                co.refresh()
                status = co.job_status()["status"]
                if status in _ENDED:
                    self._keep_ended(co, status)
                try:  # each job's save in half of what is left: the later ones still get time
                    co.shutdown(timeout_s=self.stop_timeout_s())
                except Exception:  # noqa: BLE001 - one job's failed save must not cost the others theirs
                    log.exception("DeltaServe: the final checkpoint of job %s failed", co.job_id)
            if self.sharing is not None:
                self.sharing.close()  # the hooks go; every job is shut down already
        finally:
            for exporter in self._exporters.values():
                exporter.close()  # the last values, the final checkpoint included
            for fn in reversed(self._cleanups):
                try:
                    fn()
                except Exception:  # noqa: BLE001 -- one failed cleanup must not skip the others
                    log.exception("DeltaServe: cleanup after the final checkpoint failed")
