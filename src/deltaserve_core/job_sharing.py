"""Several fine-tuning jobs on one host: who gets the harvested capacity, step by step.

A host has one set of fine-tuning rows per step and one reserved adapter (:data:`~.hooks.RESERVED_ADAPTER_NAME`).
:class:`JobSharing` sits between the host and N :class:`~deltaserve_core.coserve.CoServer`\\ s, one per job: the
host sees only it (schedule interceptor, step sink, activation sink), and each job sees a per-job view of the host
(:class:`JobHostView`) in place of the real one. Each job keeps everything that is its own: its data pool, its
activation buffer (its reserved rows), its backward process, its checkpoint folder, its published versions, its
latency model and SLO margin, its operator controls.

The policy (stated once here, and in docs/architecture.md, "Several jobs"):

* **One job holds the fine-tuning rows at a time** (its *turn*); only it may admit samples into a step, and the
  host's reserved adapter holds its newest weights. Every other job's admission holds with reason ``other_job``
  (:class:`~deltaserve_core.admission.AdmissionReason`); their housekeeping (absorbing finished backward steps,
  checkpoints, publishing, recovery, end-of-data dispatch) still runs every step.
* **Who may hold it**: a job that is *ready* (:attr:`CoServer.ready_for_rows`): *backlogged* (started, not paused,
  stopping, recovering or failed, samples left), room in its buffer, and its backward not applying an optimizer step
  (Algorithm 1, line 2). So while one job waits for its optimizer step, another forwards its samples: one job's
  backward overlaps another's forwards.
* **Priority first**: a ready job of a higher ``share.priority`` takes the rows from a lower one at the next step;
  lower priorities get only the steps that no job of a higher one is ready for.
* **Then weighted fair share of fine-tuning tokens**: each job's *virtual tokens* are the fine-tuning tokens its
  rows ran (forwarded, so what it consumed of the harvested capacity) divided by its ``share.weight``. The holder
  keeps its turn while it is ready and its virtual tokens are at most ``switch_tokens`` above the lowest of the other
  ready jobs of its priority; otherwise the ready job with the fewest virtual tokens takes over. Over a run in which
  jobs compete, tokens split in proportion to the weights. A job keeps its credit across the steps its own backward
  runs (that is where the others' share comes from; forfeiting it there would make every split 1:1), but not across
  an absence: a job that joins, or is backlogged again after a pause, a recovery or the end of its data, starts from
  the lowest virtual tokens of the others (start-time fair queuing), so it cannot starve them to catch up.
  ``switch_tokens`` bounds how often turns change: each change costs one adapter install on the host.
* **Exactness** is per job and does not depend on turn lengths: every row of job *j* runs on *j*'s newest adapter.
  A job's weights change only when its own optimizer step lands, which admission waits for (coserve.py's ordering
  rule); a turn change installs the new holder's newest weights before its first admission, and is done only when no
  step carrying fine-tuning rows is in flight. So a job's open optimizer step can span turns: its samples of
  backward batch *k* all run with its adapter after step *k-1*, whichever steps they run in.

Step records: the record of a step that carried a job's rows goes to that job (matched by ``step_id``); every other
job sees it through :meth:`CoServer.observe_foreign_step` (its latency model learns the step; nothing else does). A
record of a step without fine-tuning rows goes to every job. Each job keeps its own latency model: one model shared
by two jobs would observe every record twice, so :meth:`JobSharing.add` refuses a model another job already uses.
The activation sink calls are routed by ``step_id`` to the buffer of the job whose rows the step carries.
``on_arrival`` goes to every job (each aborts its own fine-tuning-only step).

Faults: a job's backward that dies or hangs is recovered by its CoServer (it is not ready meanwhile; the others go
on). An exception raised by a job's own code inside the host's step (its ``on_schedule``, its step sink, its
buffer as activation sink) fails that job alone (:meth:`CoServer.contain_failure`): it is no longer called, its
rows are refused, and the other jobs and inference go on.

Hosts: the routing of the activation sink happens in the process that calls it, so hosts whose forward side runs in
the scheduling process (the reference host, vLLM in-process, SGLang and S-LoRA's adapters, which call the sink from
the scheduler's own process) are served. A data-parallel job (``data_parallel.world_size`` > 1) runs alone on its
host: it may be added to an empty JobSharing only, and nothing may be added beside it. A job alone holds the rows
at every step, so one job through JobSharing admits exactly as its CoServer alone on the host would.
"""

from __future__ import annotations

import itertools
import logging
import os
import queue
import threading
import time
import weakref
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

from .adapter_state import LoraAdapterState
from .admission import AdmissionReason
from .coserve import CoServer
from .hooks import ActivationSink, HostHooks, ScheduleInterceptor, StepSink
from .hostkit import publish_dir
from .job_config import JobConfig, JobConfigError
from .types import ExecutionMode, FineTuneSample, HostCapabilities, ModelSpec, ProfileShape, ProposedBatch, StepRecord

__all__ = ["JobHostView", "JobSharing", "SharedJob"]

log = logging.getLogger("deltaserve.job_sharing")


@dataclass(eq=False)
class SharedJob:
    """One job as :class:`JobSharing` tracks it."""

    co: CoServer
    index: int
    #: fine-tuning tokens its rows ran (forwarded), the fair share's measure
    tokens: int = 0
    #: virtual tokens at which it (re)joined the competition (see the module docs)
    base: float = 0.0
    tokens_at_base: int = 0
    #: its newest adapter state, as its controller last set it; installed on the host when it takes the rows
    adapter: LoraAdapterState | None = None
    live: bool = False  # its controller installed its hooks (started) and has not removed them
    failed: str | None = None
    turns: int = 0
    #: steps in which it was ready for rows that another job held (what the policy made it wait)
    waited_steps: int = 0
    was_backlogged: bool = False
    view: JobHostView | None = field(default=None, repr=False)

    @property
    def weight(self) -> float:
        return float(self.co.job.share.weight)

    @property
    def priority(self) -> int:
        return int(self.co.job.share.priority)

    @property
    def virtual(self) -> float:
        return self.base + (self.tokens - self.tokens_at_base) / self.weight


class JobHostView:
    """What one job's :class:`CoServer` sees in place of the host (see the module docs).

    Publishing, retracting, profiling and every read go straight to the host: published versions are per job and
    never wait for a turn. ``set_finetune_adapter`` is kept as the job's newest state and reaches the host only while
    the job holds the fine-tuning rows (or nobody does yet). The hook installers register the job with
    :class:`JobSharing` instead of replacing the host's hooks, which JobSharing owns. Anything else (``base_weights``,
    ``submit``, ...) is the host's own."""

    def __init__(self, sharing: JobSharing, host: HostHooks, job: SharedJob) -> None:
        self._sharing = sharing
        self._host = host
        self._job = job

    @property
    def name(self) -> str:
        return self._host.name

    def __getattr__(self, item: str) -> Any:
        return getattr(self._host, item)

    def capabilities(self) -> HostCapabilities:
        return self._host.capabilities()

    def model_spec(self) -> ModelSpec:
        return self._host.model_spec()

    def intercept_schedule(self, interceptor: ScheduleInterceptor | None) -> None:
        self._sharing._set_live(self._job, interceptor is not None)

    def capture_activation(self, sink: ActivationSink | None) -> None:
        pass  # JobSharing routes to the job's own buffer (co.buffer) by step_id

    def report_step_time(self, sink: StepSink | None) -> None:
        pass  # JobSharing routes records to the job itself

    def graph_mode(self, batch: ProposedBatch) -> ExecutionMode:
        return self._host.graph_mode(batch)

    def set_finetune_adapter(self, state: LoraAdapterState) -> None:
        self._sharing._set_adapter(self._job, state)

    def publish_adapter(self, state: LoraAdapterState) -> str:
        # A server's host publishes into one folder, the running job's (vLLM's and SGLang's serving hosts, see
        # EngineRuntime): point it at this job's before each publish, so versions stay with their job.
        publish_to = getattr(self._host, "publish_to", None)
        if callable(publish_to):
            publish_to(publish_dir(self._job.co.job))
        return self._host.publish_adapter(state)

    def retract_adapter(self, name: str) -> None:
        self._host.retract_adapter(name)

    def run_profile_step(self, shape: ProfileShape) -> StepRecord:
        return self._host.run_profile_step(shape)


class JobSharing:
    """Several fine-tuning jobs on one host; see the module docstring for the policy.

    Usage::

        sharing = JobSharing(host).start()           # installs itself as the host's hooks
        a = sharing.start_job(job_a, latency_model=...)  # a started CoServer, on its own view of the host
        b = sharing.start_job(job_b, latency_model=...)
        ...                                          # the host steps; each job trains its own adapter
        sharing.close()                              # closes every job, then removes the hooks

    Jobs are added, started and removed on the thread that steps the host (the jobs API's calls run there too);
    only ``on_arrival``, :meth:`build` (with the job's ``prepare()``) and :meth:`hand_over` may come from another
    thread.
    """

    def __init__(self, host: HostHooks, *, switch_tokens: float = 256.0,
                 coserver_factory: Callable[..., CoServer] = CoServer) -> None:
        """``switch_tokens``: how far (in fine-tuning tokens divided by weight) the holder of the rows may run ahead
        of the least-served ready job of its priority before the turn changes (see the module docs).
        ``coserver_factory``: builds each job's controller from (view, job, **options); :class:`CoServer` except in
        tests of the policy alone."""
        if not switch_tokens >= 0:
            raise ValueError(f"switch_tokens must be >= 0 fine-tuning tokens, got {switch_tokens!r}")
        self.host = host
        self._factory = coserver_factory
        self.switch_tokens = float(switch_tokens)
        self._jobs: list[SharedJob] = []
        self._order = itertools.count()  # the order jobs were added in: ties go to the earlier
        self._live: tuple[SharedJob, ...] = ()  # replaced whole, read by on_arrival from any thread
        self._owner: SharedJob | None = None  # holds the fine-tuning rows
        self._installed: SharedJob | None = None  # whose weights the host's reserved adapter holds
        self._step_owner: dict[int, SharedJob] = {}  # steps whose rows were admitted, until their record
        self._lock = threading.Lock()
        self._ready: list[SharedJob] = []  # the jobs ready for rows at the last step
        #: jobs built and not joined yet, by id of their controller; weak, so one never joined (its preparation
        #: failed or was cancelled) is not kept
        self._built: weakref.WeakValueDictionary[int, SharedJob] = weakref.WeakValueDictionary()
        #: work queued from other threads for the host's thread (hand_over)
        self._handovers: queue.SimpleQueue[Callable[[], None]] = queue.SimpleQueue()
        self._started = False
        self.switches = 0
        self.switch_s = 0.0

    # ------------------------------------------------------------------------------------------ lifecycle

    def start(self) -> JobSharing:
        self.host.intercept_schedule(self)
        self.host.capture_activation(self)
        self.host.report_step_time(self)
        self._started = True
        return self

    def close(self, timeout_s: float = 60.0) -> None:
        """Close every job (no final checkpoint: use :meth:`shutdown` for that), then remove the hooks."""
        for j in list(self._jobs):
            try:
                j.co.close()
            except Exception:  # noqa: BLE001 - one job's failure to close must not leave the others running
                log.exception("closing fine-tuning job %s", j.co.job_id)
        if self._started:
            self.host.intercept_schedule(None)
            self.host.capture_activation(None)
            self.host.report_step_time(None)
            self._started = False

    def shutdown(self, timeout_s: float = 60.0) -> dict[str, str | None]:
        """Every job's :meth:`CoServer.shutdown` (final checkpoint, then close), then the hooks removed; returns each
        job id's checkpoint folder."""
        out: dict[str, str | None] = {}
        for j in list(self._jobs):
            try:
                out[j.co.job_id] = j.co.shutdown(timeout_s=timeout_s)
            except Exception:  # noqa: BLE001
                log.exception("shutting down fine-tuning job %s", j.co.job_id)
                out[j.co.job_id] = None
        self.close()
        return out

    def __enter__(self) -> JobSharing:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.close()

    # ------------------------------------------------------------------------------------------ jobs

    @property
    def jobs(self) -> tuple[CoServer, ...]:
        return tuple(j.co for j in self._jobs)

    def job(self, job_id: str) -> CoServer | None:
        return next((j.co for j in self._jobs if j.co.job_id == job_id), None)

    def add(self, job: JobConfig, **coserver_kwargs: Any) -> CoServer:
        """A :class:`CoServer` for ``job`` on its own view of the host, not started (call its ``start()``, or use
        :meth:`start_job`). Refuses a job whose ``adapter_name`` or ``checkpoint.dir`` another job here has (their
        published versions or checkpoints would overwrite each other), and a data-parallel job."""
        co = self.build(job, **coserver_kwargs)
        self.join(co)
        return co

    def build(self, job: JobConfig, **coserver_kwargs: Any) -> CoServer:
        """:meth:`add`'s controller, not yet among this host's jobs: its construction loads and tokenises the
        dataset (seconds), so a server builds (and prepares: :meth:`CoServer.prepare`) a job created over HTTP on
        another thread while the host serves, and joins it (:meth:`join`) on the host's thread. Checks ``job`` against
        the jobs here now; :meth:`join` checks again."""
        self._check_beside(job)
        slot = SharedJob(co=None, index=next(self._order))  # type: ignore[arg-type]
        slot.view = JobHostView(self, self.host, slot)
        slot.co = self._factory(slot.view, job, **coserver_kwargs)
        with self._lock:
            self._built[id(slot.co)] = slot
        return slot.co

    def join(self, co: CoServer) -> None:
        """Make ``co`` (from :meth:`build`) one of this host's jobs, on the host's thread; its ``start()`` or
        ``attach()`` then installs its hooks."""
        with self._lock:
            slot = self._built.get(id(co))
        if slot is None or slot.co is not co:
            raise ValueError(f"job {co.job_id} was not built by this JobSharing")
        self._check_beside(co.job)
        with self._lock:
            self._built.pop(id(co), None)
            self._jobs.append(slot)

    def _check_beside(self, job: JobConfig) -> None:
        # a data-parallel job's ranks step in lockstep with other engines: turns given to another job here would
        # stall every rank, so it runs alone (added to an empty JobSharing, nothing beside it)
        if job.data_parallel.enabled and self._jobs:
            raise JobConfigError(f"job config: data_parallel.world_size: {job.data_parallel.world_size}: a "
                                 "data-parallel job runs alone on its host; run it on its own servers, or set it to 1")
        alone = next((j for j in self._jobs if j.co.job.data_parallel.enabled), None)
        if alone is not None:
            raise JobConfigError(f"job {alone.co.job_id} is data-parallel and runs alone on this host: run "
                                 f"{job.adapter_name!r} on another server, or after that job has been removed")
        mine = os.path.realpath(job.checkpoint.dir)
        for other in self._jobs:  # a failed job keeps its folder and name until it is removed
            theirs = os.path.realpath(other.co.job.checkpoint.dir)
            if mine == theirs or mine.startswith(theirs + os.sep) or theirs.startswith(mine + os.sep):
                raise JobConfigError(
                    f"job config: checkpoint.dir: {job.checkpoint.dir!r} is (or nests with) the folder of job "
                    f"{other.co.job_id} ({other.co.job.checkpoint.dir!r}) on this host; two jobs must never share a "
                    "checkpoint folder: give this job its own checkpoint.dir")
            if other.co.job.adapter_name == job.adapter_name:
                raise JobConfigError(
                    f"job config: adapter_name: {job.adapter_name!r} is the adapter of job {other.co.job_id} on this "
                    "host; their published versions would collide: give this job another adapter_name")

    def hand_over(self, fn: Callable[[], None]) -> None:
        """Run ``fn`` on the host's thread before the next step's admission (from any thread): how work done on
        another thread (a created job prepared there) reaches the jobs, which only that thread may change. The
        host must be stepping for it to run (a runtime keeps its idle loop stepping meanwhile: ``wants_steps``);
        :meth:`run_handovers` also runs them between steps."""
        self._handovers.put(fn)

    def run_handovers(self) -> None:
        """Run what :meth:`hand_over` queued, on the host's thread; one that raises is logged and the rest run."""
        while True:
            try:
                fn = self._handovers.get_nowait()
            except queue.Empty:
                return
            try:
                fn()
            except Exception:  # noqa: BLE001 - a hand-over failing must never stop the host's step
                log.exception("a hand-over to the jobs of this host failed")

    def start_job(self, job: JobConfig, **coserver_kwargs: Any) -> CoServer:
        """:meth:`add` then ``start()``; a job whose start fails is forgotten again before the error propagates."""
        co = self.add(job, **coserver_kwargs)
        try:
            return co.start()
        except BaseException:
            self._forget(self._slot(co))
            raise

    def remove(self, co: CoServer) -> None:
        """Close ``co`` and forget it (its checkpoints and published versions stay)."""
        slot = self._slot(co)
        try:
            co.close()
        finally:
            self._forget(slot)

    def _slot(self, co: CoServer) -> SharedJob:
        for j in self._jobs:
            if j.co is co:
                return j
        raise KeyError(f"job {co.job_id} is not on this JobSharing")

    def _forget(self, slot: SharedJob) -> None:
        with self._lock:
            self._set_live(slot, False)
            self._jobs = [j for j in self._jobs if j is not slot]

    def _set_live(self, slot: SharedJob, live: bool) -> None:
        if live and not slot.live:
            for other in self._live:
                if other.co.model is slot.co.model:
                    raise ValueError(f"job {slot.co.job_id} uses the latency model of job {other.co.job_id}: each job "
                                     "refits its own from every step record, so pass each its own LatencyModel")
            self._rejoin(slot)
        slot.live = live
        if not live:
            if self._owner is slot:
                self._owner = None
            self._step_owner = {k: v for k, v in self._step_owner.items() if v is not slot}
        self._live = tuple(j for j in self._jobs if j.live)

    def _set_adapter(self, slot: SharedJob, state: LoraAdapterState) -> None:
        # the host contract: the caller may change `state` once we return, and we keep it for later turns
        slot.adapter = state.with_tensors({k: v.detach().clone() for k, v in state.tensors.items()},
                                          version=state.version)
        if self._installed is None or self._installed is slot:
            self.host.set_finetune_adapter(slot.adapter)
            self._installed = slot

    def _rejoin(self, slot: SharedJob) -> None:
        """Start ``slot``'s virtual tokens at the lowest of the other live jobs', so a job that joins (or is ready
        again after a pause) neither starves the others to catch up nor is starved by their past."""
        others = [j.virtual for j in self._live if j is not slot and j.failed is None]
        floor = min(others) if others else 0.0
        if slot.virtual < floor:
            slot.base, slot.tokens_at_base = floor, slot.tokens

    def _fail(self, slot: SharedJob, where: str, exc: BaseException) -> None:
        message = f"{where} raised {type(exc).__name__}: {exc}"
        log.error("fine-tuning job %s failed (contained; other jobs and inference go on): %s", slot.co.job_id,
                  message, exc_info=exc)
        slot.failed = message
        try:
            slot.co.contain_failure(message)
        except Exception:  # noqa: BLE001 - the job is out either way
            log.exception("marking job %s failed", slot.co.job_id)
        with self._lock:
            self._set_live(slot, False)

    # ------------------------------------------------------------------------------------------ turns

    def _choose(self, live: Sequence[SharedJob]) -> SharedJob | None:
        """The job that holds the rows this step (see the module docs); None when no job is ready."""
        ready = []
        for j in live:
            backlogged = j.co.backlogged
            if backlogged and not j.was_backlogged:
                self._rejoin(j)  # no credit banked while paused or recovering (its backward running is no pause)
            j.was_backlogged = backlogged
            if backlogged and j.co.ready_for_rows:
                ready.append(j)
        self._ready = ready
        if len(live) == 1:
            # a job alone holds the rows throughout: its admission decides as a CoServer alone on the host would,
            # with its own reasons, never ``other_job``
            return live[0]
        if not ready:
            return self._owner if self._owner is not None and self._owner.live else None
        top = max(j.priority for j in ready)
        ready = [j for j in ready if j.priority == top]
        best = min(ready, key=lambda j: (j.virtual, j.index))
        owner = self._owner
        if owner in ready and owner.virtual <= best.virtual + self.switch_tokens:
            return owner
        return best

    def _switch(self, new: SharedJob) -> float:
        """Give ``new`` the rows: install its newest weights unless the host holds them. Seconds it took."""
        self._owner = new
        new.turns += 1
        if self._installed is new or new.adapter is None:
            return 0.0
        t0 = time.monotonic()
        self.host.set_finetune_adapter(new.adapter)
        took = time.monotonic() - t0
        self._installed = new
        self.switches += 1
        self.switch_s += took
        new.co._host_work_s["install"].append(took)  # its own installs were measured on the view: this is the cost
        return took

    # ------------------------------------------------------------------------------------------ ScheduleInterceptor

    def on_schedule(self, batch: ProposedBatch) -> Sequence[FineTuneSample]:
        self.run_handovers()
        live = self._live
        if not live:
            return ()
        chosen = self._choose(live)
        switch_s = 0.0
        if chosen is not None and chosen is not self._owner:
            if self._step_owner:
                chosen = self._owner  # a step with rows is in flight: the host's adapter must not change under it
            else:
                try:
                    switch_s = self._switch(chosen)
                except Exception as exc:  # noqa: BLE001 - the host refused this job's adapter: this job fails
                    self._fail(chosen, "installing its adapter for its turn", exc)
                    self._owner = chosen = None
        for j in self._ready:
            if j is not chosen:
                j.waited_steps += 1
        samples: Sequence[FineTuneSample] = ()
        for j in live:
            if not j.live:
                continue
            co = j.co
            # a step whose spare time went to a turn change takes no rows, as for a CoServer's own installs
            co.turn_hold = (None if j is chosen and not (switch_s and not batch.is_empty)
                            else AdmissionReason.HOST_WORK_IN_STEP if j is chosen else AdmissionReason.OTHER_JOB)
            if j is chosen and switch_s:
                co.admission.discount_gap(switch_s)
            try:
                got = co.on_schedule(batch)
            except Exception as exc:  # noqa: BLE001 - contain it to this job
                self._fail(j, "on_schedule", exc)
                continue
            if got:
                if j is not chosen:  # cannot happen: its admission held; refuse rather than run them unowned
                    self._fail(j, "on_schedule", RuntimeError("admitted rows without holding the turn"))
                    continue
                samples = got
                self._step_owner[batch.step_id] = j
        return samples

    def on_arrival(self, request_id: str, arrival_time: float) -> None:
        for j in self._live:
            try:
                j.co.on_arrival(request_id, arrival_time)
            except Exception:  # noqa: BLE001 - a client request must never fail for a job
                log.exception("job %s on_arrival", j.co.job_id)

    # ------------------------------------------------------------------------------------------ StepSink

    def __call__(self, record: StepRecord) -> None:
        owner = self._step_owner.pop(record.step_id, None)
        if owner is not None:
            owner.tokens += record.finetune_tokens
        # rows nobody here owns (a failed job's): no job may count them as its own samples
        orphan = (owner is None and not record.synthetic
                  and bool(record.finetune_sample_ids or record.aborted_sample_ids))
        for j in self._live:
            try:
                if j is owner or (owner is None and not orphan):
                    j.co(record)
                else:
                    j.co.observe_foreign_step(record)
            except Exception as exc:  # noqa: BLE001
                self._fail(j, "the step sink", exc)

    # ------------------------------------------------------------------------------------------ ActivationSink

    def _buffer_of(self, step_id: int) -> tuple[SharedJob | None, Any]:
        j = self._step_owner.get(step_id)
        return (j, j.co.buffer) if j is not None and j.live else (None, None)

    def begin_step(self, step_id: int, samples: Sequence[FineTuneSample]) -> None:
        j, buf = self._buffer_of(step_id)
        if buf is not None:
            try:
                buf.begin_step(step_id, samples)
            except Exception as exc:  # noqa: BLE001
                self._fail(j, "its activation buffer (begin_step)", exc)  # type: ignore[arg-type]

    def layer_input(self, step_id: int, layer: int, sample_id: int, hidden: torch.Tensor) -> None:
        j, buf = self._buffer_of(step_id)
        if buf is not None:
            try:
                buf.layer_input(step_id, layer, sample_id, hidden)
            except Exception as exc:  # noqa: BLE001
                self._fail(j, "its activation buffer (layer_input)", exc)  # type: ignore[arg-type]

    def should_abort(self, step_id: int) -> bool:
        j, buf = self._buffer_of(step_id)
        return False if buf is None else bool(buf.should_abort(step_id))

    def end_step(self, step_id: int, completed: Sequence[int], aborted: Sequence[int]) -> None:
        j, buf = self._buffer_of(step_id)
        if buf is not None:
            try:
                buf.end_step(step_id, completed, aborted)
            except Exception as exc:  # noqa: BLE001
                self._fail(j, "its activation buffer (end_step)", exc)  # type: ignore[arg-type]

    # ------------------------------------------------------------------------------------------ progress

    def poll(self) -> None:
        """Every live job's housekeeping (hosts call nothing extra; idle loops and tests may call it)."""
        for j in self._live:
            try:
                j.co.poll()
            except Exception as exc:  # noqa: BLE001
                self._fail(j, "poll", exc)

    @property
    def finished(self) -> bool:
        """Every job finished, failed or was removed."""
        return all(j.co.finished or j.failed is not None or j.co._failed is not None for j in self._jobs)

    @property
    def wants_steps(self) -> bool:
        if not self._handovers.empty():
            return True
        return any(j.co.wants_steps and j.failed is None and j.co._failed is None for j in self._live)

    def status(self) -> dict[str, Any]:
        """The sharing's state: who holds the rows, turn changes and what each job got."""
        return {
            "holder": self._owner.co.job_id if self._owner is not None else None,
            "switches": self.switches,
            "switch_s": self.switch_s,
            "jobs": [{"id": j.co.job_id, "adapter": j.co.job.adapter_name, "weight": j.weight,
                      "priority": j.priority, "tokens": j.tokens, "virtual_tokens": j.virtual, "turns": j.turns,
                      "waited_steps": j.waited_steps,
                      "live": j.live, "ready": j.co.ready_for_rows if j.live else False, "failed": j.failed}
                     for j in self._jobs],
        }
