"""A job created over HTTP between its create's answer and its start on the host: prepared on a thread of its own.

Preparing a job takes seconds to tens of seconds on a CPU: its dataset is loaded and tokenised (the
:class:`~deltaserve_core.coserve.CoServer`'s construction) and its backward process is spawned and imports torch
(:meth:`CoServer.prepare <deltaserve_core.coserve.CoServer.prepare>`). Done on the thread that steps the engine,
that stalled every client of the server for as long (measured: docs/benchmarks.md, benchmarks/create_stall.py).
So a create is checked and
answered at once with the job in status ``validating_files`` (OpenAI's name), the preparation runs on a thread of
this job's, and only the cheap join (adapter install, hooks: :meth:`CoServer.attach
<deltaserve_core.coserve.CoServer.attach>`) runs on the engine's thread, handed over between two steps.

:class:`PreparingJob` answers the jobs API for the job meanwhile (a
:class:`~deltaserve_core.job_control.ControlledJob`): get and list show it ``validating_files``, ``failed`` with
OpenAI's error object (``code``, ``message``, ``param``) when the preparation failed, ``cancelled`` once a cancel
has released what the preparation started. Engine-agnostic; :class:`~deltaserve_core.runtime.EngineRuntime` owns
these objects and replaces each by its CoServer once that is attached.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Literal

from .job_control import EventLog, JobCallError, job_id
from .job_create import CreatedJob
from .job_status import job_object

if TYPE_CHECKING:
    from .coserve import CoServer

__all__ = ["PreparingJob", "PrepState"]

log = logging.getLogger("deltaserve.runtime")

#: ``preparing``: its thread runs; ``ready``: prepared, waiting for the engine's thread; ``attached``: its
#: CoServer joined the host (the runtime answers for it from then on); ``failed``, ``cancelled``: ended, nothing
#: of it runs; ``stopped``: the server stopped before it ran, nothing of it runs, and it is not over (the next
#: start prepares it again), so the API still says ``validating_files``
PrepState = Literal["preparing", "ready", "attached", "failed", "cancelled", "stopped"]
_STATUS: dict[str, str] = {"preparing": "validating_files", "ready": "validating_files", "attached": "running",
                           "failed": "failed", "cancelled": "cancelled", "stopped": "validating_files"}


class PreparingJob:
    """One created job while it is prepared (see the module docs).

    ``build``: the job's controller, constructed (dataset loaded) but not prepared, on this job's thread; a
    :class:`~deltaserve_core.job_control.JobCallError` it raises is the job's error as it stands (an unusable
    dataset is the client's ``invalid_training_file``), anything else a ``job_start_failed``. ``done``: called on
    this job's thread once it is ``ready``, ``failed`` or ``cancelled``, to hand the job to the engine's thread
    (:meth:`~deltaserve_core.job_sharing.JobSharing.hand_over`). ``model``: the base model's name in the job
    object."""

    def __init__(self, created: CreatedJob, model: str, *, build: Callable[[], CoServer],
                 done: Callable[[PreparingJob], None]) -> None:
        self.job = created.job
        self.record = created.record
        self.job_id = job_id(created.job.adapter_name)
        #: the job's events from its create on; its CoServer goes on with the same log, so ids keep growing
        self.events = EventLog()
        self.co: CoServer | None = None
        self._model = model
        self._build = build
        self._done = done
        # the job's thread and the engine's thread (a cancel, a stop) both end the preparation
        self._lock = threading.Lock()
        self._state: PrepState = "preparing"
        self._abandoned = False  # cancelled, or the server stops: whatever was started is released
        self._stopping = False  # the server stops (not the operator's cancel): the job ends "stopped"
        self._error: dict[str, Any] | None = None
        self._finished_at: int | None = None
        self._thread = threading.Thread(target=self._run, name=f"deltaserve-prepare-{self.job.adapter_name}",
                                        daemon=True)

    @property
    def state(self) -> PrepState:
        return self._state

    def start(self) -> PreparingJob:
        self._thread.start()
        return self

    # ------------------------------------------------------------------------------------ the job's thread

    def _run(self) -> None:
        try:
            co = self._build()
            co.events = self.events
            with self._lock:
                self.co = co
                go = not self._abandoned
            if go:
                self.events.add("info", "training file loaded: starting the backward process",
                                data={"samples": len(co.dataset)})
                co.prepare()
        except BaseException as exc:  # noqa: BLE001 - this thread's end is the job's failure, reported by the API
            self._ended_in_preparation(exc)
            return
        with self._lock:
            abandoned = self._abandoned
            if not abandoned:
                self._state = "ready"
        if abandoned:
            self._release()
            self._set_ended(self._abandoned_as())
        self._done(self)

    def _ended_in_preparation(self, exc: BaseException) -> None:
        self._release()
        if self._abandoned:  # the cancel (or stop) killed what was starting: no failure of the job
            self._set_ended(self._abandoned_as())
        else:
            if isinstance(exc, JobCallError):
                error = {"code": exc.code, "message": exc.message, "param": exc.param}
            else:
                error = {"code": "job_start_failed", "message": f"job {self.job_id} did not start: "
                         f"{type(exc).__name__}: {exc}", "param": None}
            log.error("DeltaServe: the created job %s failed while it was prepared: %s", self.job_id,
                      error["message"], exc_info=not isinstance(exc, JobCallError))
            self.fail(error)
        self._done(self)

    # ------------------------------------------------------------------------------------ either thread

    def fail(self, error: dict[str, Any]) -> None:
        """End the job ``failed`` with OpenAI's error object ``error`` (what it prepared is released)."""
        self._release()
        with self._lock:
            self._error = error
        self.events.add("error", error["message"])
        self._set_ended("failed")

    def attached(self) -> None:
        """Its CoServer joined the host (the engine's thread): the runtime answers for it from now on."""
        with self._lock:
            self._state = "attached"

    def abandon(self, *, stopping: bool = False) -> None:
        """Stop the preparation and release what it started, now or as soon as its thread can: the operator's
        cancel, or (``stopping``) the server stopping, after which the job is not over. A backward process starting
        is killed (a prepared job is discarded, so nothing of its state can be lost), which ends the thread's wait
        for it at once."""
        with self._lock:
            if self._state in ("attached", "failed", "cancelled", "stopped"):
                return
            self._abandoned = True
            self._stopping = self._stopping or stopping
            state, co = self._state, self.co
        if state == "ready":  # prepared and waiting for the engine's thread, whose hand-over will skip it
            self._release()
            self._set_ended(self._abandoned_as())
            return
        backward = co.backward if co is not None else None
        if backward is not None:
            backward.kill()

    def wait(self, timeout_s: float) -> bool:
        """Wait up to ``timeout_s`` for the job's thread to end; whether it did. After it, nothing of the
        preparation runs; a backward process still starting is killed."""
        self._thread.join(timeout_s)
        if self._thread.is_alive():
            co = self.co
            if co is not None and co.backward is not None:
                co.backward.kill()
            return False
        return True

    def _release(self) -> None:
        co = self.co
        if co is not None:
            try:
                co.close()  # never attached: stops its backward and frees its buffer, touches no hook
            except Exception:  # noqa: BLE001 - the job ends either way
                log.exception("DeltaServe: releasing the prepared job %s", self.job_id)

    def _abandoned_as(self) -> Literal["cancelled", "stopped"]:
        return "stopped" if self._stopping else "cancelled"

    def _set_ended(self, state: Literal["failed", "cancelled", "stopped"]) -> None:
        with self._lock:
            self._state = state
            self._finished_at = int(time.time())

    # ------------------------------------------------------------------------------------ ControlledJob

    def refresh(self) -> None:
        pass

    def job_status(self) -> dict[str, Any]:
        with self._lock:
            status, error, finished_at, abandoned = _STATUS[self._state], self._error, self._finished_at, \
                self._abandoned
        out = job_object(self.job, self._model, status, int(self.record["created_at"]))
        out.update(error=error, finished_at=finished_at if status in ("failed", "cancelled") else None)
        out["deltaserve"]["cancel_requested"] = abandoned and not self._stopping and status == "validating_files"
        return out

    def job_checkpoints(self) -> list[dict[str, Any]]:
        return []

    def _refuse(self, op: str) -> dict[str, Any]:
        status = self.job_status()["status"]
        ended = status in ("failed", "cancelled")
        raise JobCallError(409, f"cannot {op} job {self.job_id}: it is {status}"
                           + ("" if ended else f"; {op} it once it is running"),
                           code="job_not_active" if ended else "job_not_running", param="id")

    def pause(self) -> dict[str, Any]:
        return self._refuse("pause")

    def resume(self) -> dict[str, Any]:
        return self._refuse("resume")

    def cancel(self) -> dict[str, Any]:
        """Cancel while it is prepared: nothing trained, what its preparation started is released (the job is
        ``cancelled`` once it is; at once unless its backward process was starting)."""
        status = self.job_status()["status"]
        if status == "cancelled":
            return self.job_status()
        if status != "validating_files":
            return self._refuse("cancel")
        if not self._abandoned:
            log.info("DeltaServe: job %s cancelled while it was prepared", self.job_id)
            self.events.add("info", "cancelled while validating files: its preparation stops, nothing was trained")
        self.abandon()
        return self.job_status()
