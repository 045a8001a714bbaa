"""One engine runtime: the co-serving job inside an engine's own server process, the same on every engine.

Under ``vllm serve``, SGLang's server and S-LoRA's server, DeltaServe runs in the engine process that steps the
model (vLLM's EngineCore, SGLang's scheduler, S-LoRA's router). What happens there does not depend on the engine
and lives here: the job file is loaded, its publish folder made, the latency model chosen by one policy, the
:class:`~deltaserve_core.coserve.CoServer` built and started, its metrics exported, and a stop turned into a final
checkpoint within the time the engine's server waits for it. An adapter's serving module builds its host (the
engine translation) and says what its engine allows: whether calibration can run in place, how a stop reaches
the engine's loop, what to clean up.

The latency-model policy: the stored calibration profile of this host (same model path, dtype and device) when
there is one. Without one, the host is calibrated in place, with progress, where the engine lets DeltaServe step
it before the serving loop starts (SGLang); where the serving loop owns every step from the start (vLLM's
EngineCore, S-LoRA's router), start-up stops with the one command that stores a profile.
"""

from __future__ import annotations

import logging
import signal
import threading
import time
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from .hooks import HostHooks
from .hostkit import publish_dir
from .job_config import JobConfig, JobConfigError, load_job_config
from .job_control import JobCallError, job_call
from .job_create import (CreatedJob, JobsSettings, config_error, current_suffix, forget_created, job_from_request,
                         save_created)

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


class EngineRuntime:
    """The CoServer of one engine server process, from the job file to the final checkpoint, and the jobs created
    over HTTP after it (one at a time).

    Lifecycle: construct (job loaded, publish folder made) -> :meth:`start` with the adapter's host ->
    :meth:`job_call` for the jobs API (a create starts the next job once the previous one ended) ->
    :meth:`begin_stop` (from a signal handler or the engine's own shutdown request) -> :meth:`stop` (final
    checkpoint, then cleanup). ``grace_s``: how long the engine's server waits for this process after it asked it
    to stop; :meth:`stop` spends at most half of what is left on the job's shutdown, so the save still fits."""

    def __init__(self, job: JobConfig | str | Path | None, *, engine: str, grace_s: float, log_every_s: float = 10.0,
                 where: str | None = None, dp_rank: int | None = None, jobs: JobsSettings | None = None,
                 created: CreatedJob | None = None, served_models: tuple[str, ...] = (), engines: int = 1) -> None:
        """``engine``: the host's short name; ``where``: the process, as the start line names it; ``dp_rank``: this
        engine's rank in a data-parallel job (None for a job of one replica).

        ``job``: the job to start with (None: none until one is created, which needs ``jobs``); ``jobs``: the
        operator's settings for jobs created over HTTP; ``created``: ``job``'s record when it was created over HTTP
        (:func:`~deltaserve_core.job_create.startup_job`); ``served_models``: the names a create's ``model`` may
        give (the first is named in refusals); ``engines``: how many engines of this server run the job (a create
        reaches only one job of one engine, so it is refused for more)."""
        if job is None and jobs is None:
            raise ValueError("EngineRuntime needs a job, or the jobs settings under which one can be created")
        self.job: JobConfig | None = job if isinstance(job, JobConfig) or job is None else load_job_config(job)
        self.jobs = jobs
        self.created = created.record if created is not None else None
        self.served_models = served_models
        self.engines = engines
        self.engine = engine
        self.dp_rank = dp_rank
        self.where = where or f"the {engine} engine"
        if dp_rank is not None:
            self.where += f" of data-parallel rank {dp_rank}"
        self.grace_s = float(grace_s)
        self.log_every_s = float(log_every_s)
        self.publish_root: Path | None = None
        if self.job is not None:
            self.publish_root = publish_dir(self.job)
            self.publish_root.mkdir(parents=True, exist_ok=True)
        #: scratch space of the engine's host (the reserved adapter's folder); removed at stop. The ranks of a
        #: data-parallel job share checkpoint.dir, so each rank has its own. It stays where it is when a created
        #: job follows: the host keeps the folder it was given.
        rank = "" if dp_rank is None else f"-rank-{dp_rank}"
        scratch = Path(self.job.checkpoint.dir) if self.job is not None else jobs.dir  # type: ignore[union-attr]
        self.work_dir = scratch / f".serve-{engine}{rank}"
        self.host: HostHooks | None = None
        self.coserver: Any = None
        self._start_options: dict[str, Any] = {}
        self.metrics: Any = None
        self._cleanups: list[Callable[[], None]] = []
        self._on_begin_stop: list[Callable[[], None]] = []
        self._stop_signalled_at: float | None = None
        self._stopped = False
        self._lock = threading.Lock()

    # ------------------------------------------------------------------------------------ start

    def start(self, host: HostHooks, *, calibration: Mapping[str, Any] | None = None,
              calibrate_command: str | None = None, latency_model: LatencyModel | None = None,
              metrics: bool = True, metrics_snapshot: str | None = None, **coserver_options: Any) -> None:
        """Build and start the job on ``host``.

        ``calibration``: the engine can be calibrated in place now (settings for
        :func:`~deltaserve_core.calibration.load_or_calibrate`); otherwise ``calibrate_command`` is the command
        that stores a profile, named when none is stored (or ``latency_model``: the stored one, already loaded by
        an adapter that must refuse before it patches anything). ``metrics``: export the job's metrics the way
        this engine's server serves them (:func:`deltaserve_core.metrics.start_exporter`). Without a job the
        host only waits for one to be created."""
        if calibration is None and calibrate_command is None and latency_model is None:
            raise ValueError("EngineRuntime.start needs calibration settings or the command that calibrates")
        self.host = host
        self._start_options = {"calibrate_command": calibrate_command, "metrics": metrics,
                               "metrics_snapshot": metrics_snapshot, "coserver_options": coserver_options}
        if self.job is None:
            log.info("DeltaServe started in %s without a fine-tuning job: create one with POST /v1/fine_tuning/jobs "
                     "(training files from %s)", self.where, self.jobs.data_dir if self.jobs else None)
            return
        latency = latency_model
        if latency is None and calibration is None:
            latency = stored_latency_model(host, calibrate_command or "")
        settings = dict(calibration or {})
        settings.setdefault("progress", True)
        self._run_job(self._coserver_for(self.job, latency, settings if latency is None else None))

    def _coserver_for(self, job: JobConfig, latency: LatencyModel | None,
                      calibration: Mapping[str, Any] | None) -> Any:
        from .coserve import CoServer

        return CoServer(self.host, job, latency_model=latency, calibration=calibration, log_every_s=self.log_every_s,
                        dp_rank=self.dp_rank, **self._start_options["coserver_options"])

    def _run_job(self, coserver: Any) -> None:
        self.coserver = coserver
        coserver.start()
        if self._start_options["metrics"]:
            from .metrics import start_exporter

            self.metrics = start_exporter(coserver, snapshot_path=self._start_options["metrics_snapshot"])
        job = coserver.job
        log.info("DeltaServe co-serving started in %s: dataset %s, adapter %s, checkpoints in %s",
                 self.where, job.dataset, job.adapter_name, job.checkpoint.dir)

    def job_changed(self, job: JobConfig) -> None:
        """A created job replaces the previous one on this engine's host (before it starts): an adapter points what
        its host keeps per job (the publish folder) at ``job``'s."""

    def preflight_job(self, job: JobConfig) -> None:
        """What the server's start-up checks of a job file, for a created job (raises
        :class:`~deltaserve_core.job_config.JobConfigError`): an adapter adds its engine's limits. Writes nothing
        (the checkpoint folder is made when the job starts), so a refused create leaves no trace."""
        from .preflight import check_job

        check_job(job, self.host.model_spec().path if self.host is not None else None)

    # ------------------------------------------------------------------------------------ the jobs API

    def job_call(self, op: str, args: dict[str, Any] | None = None) -> dict[str, Any]:
        """One jobs-API call against this engine's job (:func:`~deltaserve_core.job_control.job_call`'s answer
        shape), ``create`` included; runs on the thread that drives the engine's steps."""
        if op == "create":
            try:
                return {"result": self._annotated(self._create((args or {}).get("body")))}
            except JobCallError as exc:
                return exc.as_dict()
        answer = job_call([self.coserver] if self.coserver is not None else [], op, args)
        if "result" in answer:
            result = answer["result"]
            answer["result"] = ([self._annotated(j) for j in result] if isinstance(result, list)
                                else self._annotated(result))
        return answer

    def _annotated(self, result: Any) -> Any:
        """A job object with what only its create request said (its metadata; its creation time, kept across
        restarts)."""
        if not isinstance(result, dict) or result.get("object") != "fine_tuning.job":
            return result
        record = self.created if self.coserver is not None and result.get("id") == self.coserver.job_id else None
        result["metadata"] = record.get("metadata") if record else None
        if record:
            result["created_at"] = record["created_at"]
            result["user_provided_suffix"] = record["suffix"]
        return result

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
        if self.stopping:
            raise JobCallError(503, "the server is stopping", type="service_unavailable", code="server_stopping")
        old = self.coserver
        if old is not None:
            old.refresh()
            status = old.job_status()["status"]
            if status not in ("succeeded", "failed", "cancelled"):
                raise JobCallError(409, f"job {old.job_id} is {status}: this server runs one fine-tuning job at a "
                                   "time (several concurrent jobs are a later step of DeltaServe); cancel it (POST "
                                   f"/v1/fine_tuning/jobs/{old.job_id}/cancel) or wait for it to end",
                                   code="job_active")
        created = job_from_request(body, self.jobs, served_models=self.served_models,
                                   taken=(old.job.adapter_name,) if old is not None else ())
        try:
            self.preflight_job(created.job)
        except JobConfigError as exc:
            raise config_error(exc) from None
        coserver = self._new_coserver(created.job, old)
        previous = current_suffix(self.jobs)
        save_created(created, self.jobs)
        if old is not None:
            old.close()  # it ended: its final checkpoint is written, its published versions stay on disk
        if self.metrics is not None:
            self.metrics.close()
            self.metrics = None
        self.coserver, self.job, self.created = None, created.job, created.record
        self.publish_root = publish_dir(created.job)
        self.publish_root.mkdir(parents=True, exist_ok=True)
        self.job_changed(created.job)
        try:
            self._run_job(coserver)
        except Exception as exc:  # noqa: BLE001 - the client's 500; the engine and its inference go on
            log.exception("DeltaServe: the created job %s did not start", coserver.job_id)
            forget_created(created, self.jobs, previous)
            self.coserver = None
            raise JobCallError(500, f"job {coserver.job_id} did not start: {exc}", type="server_error",
                               code="job_start_failed") from None
        coserver.events.add("info", f"created over HTTP (training file {created.record['training_file']})")
        return coserver.job_status()

    def _new_coserver(self, job: JobConfig, previous: Any) -> Any:
        """The created job's controller, its dataset loaded (a bad one is the client's 400 before anything stops),
        priced by the latency model the previous job ended with, else the stored profile."""
        latency = previous.model if previous is not None else None
        if latency is None:
            host: Any = self.host
            command = (self._start_options["calibrate_command"]
                       or f"deltaserve calibrate --host {self.engine} --model {host.model_spec().path}")
            try:
                latency = stored_latency_model(host, command)
            except MissingCalibrationError as exc:
                raise JobCallError(409, str(exc), code="calibration_missing") from None
        try:
            return self._coserver_for(job, latency, None)
        except (ValueError, OSError) as exc:
            raise JobCallError(400, f"training_file: not a usable dataset: {exc}", code="invalid_training_file",
                               param="training_file") from None

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
        """Whether the engine's loop should keep stepping for the job (fine-tuning-only steps)."""
        return not self.stopping and self.coserver is not None and bool(self.coserver.wants_steps)

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
        if self.coserver is not None:
            self.coserver.stop_admission()
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
            if self.coserver is not None:
                self.coserver.stop_admission()
                self.coserver.shutdown(timeout_s=self.stop_timeout_s())
        finally:
            if self.metrics is not None:
                self.metrics.close()  # the last values, the final checkpoint included
            for fn in reversed(self._cleanups):
                try:
                    fn()
                except Exception:  # noqa: BLE001 -- one failed cleanup must not skip the others
                    log.exception("DeltaServe: cleanup after the final checkpoint failed")
