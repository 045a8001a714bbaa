"""The co-serving controller: joins a host's hooks to admission, the data pool, the buffer and the backward.

One :class:`CoServer` per fine-tuning job, living in the host's scheduling process. It is the object the
host calls through the protocol (it *is* the ``ScheduleInterceptor`` and the ``StepSink``; the activation
buffer is the ``ActivationSink``), so every engine adapter drives the same policy: adapters translate, this
module decides.

Per step, in the scheduling process:
    ``on_schedule(batch)``: absorb finished backward steps (push the new adapter to the host, checkpoint,
    publish), then Algorithm 1 (:mod:`.admission`) over the pool with the buffer's free space; reserve buffer
    slots for what was admitted; mark a fine-tuning-only step abortable.
    ``__call__(record)``: refit the latency model online, track estimator error, hand completed samples to
    the backward batcher, return aborted ones to the pool.
From any thread: ``on_arrival`` arms the abort of a running fine-tuning-only step.

Exactness hinges on one ordering rule kept here: every forward of the samples of backward batch *k* runs
with the adapter after step *k-1*. Admission stops while an optimizer step is applied (Algorithm 1, line 2) and
the host gets the new weights before the next admission. An optimizer step larger than one backward unit
(``pack_tokens``) is sent to the backward in parts as their captures complete: the backward of the first parts
runs while the engine forwards the later ones, with the same adapter, and the step is applied once its batch is
complete (gradients accumulated, the update of one step over the whole batch; see
:meth:`~deltaserve_core.lora_backward.LoraBackward.accumulate`).

Faults: if the backward process dies or hangs, admission pauses (inference never waits for it), a
background thread restarts it from the newest checkpoint, the pool rewinds to that checkpoint's position
and the host's fine-tuning adapter to its weights. Samples trained after that checkpoint are trained again;
nothing is lost.

This module holds the controller's construction, lifecycle and per-step hooks; its other concerns are parts of the
class kept in their own modules: driving the backward process and recovering it (:mod:`.training`), deferred host
work (:mod:`.host_work`), publishing versions (:mod:`.published`), the operator's controls and job status
(:mod:`.job_status`), running totals (:mod:`.coserve_stats`) and the backward's base model (:mod:`.base_weights`).
Admission's policy, pricing and margin are :mod:`.admission`'s.
"""

from __future__ import annotations

import logging
import math
import threading
import time
from collections import OrderedDict, deque
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import torch

from .activation_buffer import ActivationBuffer
from .adapter_state import fresh_lora_state
from .admission import Admission, AdmissionDecision, AdmissionPolicy, AdmissionReason
from .backward_process import BackwardProcess, BackwardReport
from .base_weights import backward_base_model, model_on_lent_weights
from .checkpoint import check_writable_dir
from .cleanup import clean_stale_files
from .coserve_stats import CoServeStats
from .data_parallel import DataParallelMixin
from .finetune_data import DataConfig, FinetuneDataset, FinetunePool
from .hooks import HostHooks, validate_host
from .host_work import INSTALL, PUBLISH, HostWorkMixin, timed
from .job_config import JobConfig
from .job_status import JobStatusMixin
from .latency_model import LatencyModel
from .lora_backward import TrainerConfig
from .published import RETIRED_GRACE_S, RETIRED_MARK, PublishingMixin, delete_retired
from .slo import SLOConfig, SLOMonitor
from .slo_margin import SLOMargin
from .training import MAX_CONSECUTIVE_SAVE_FAILURES, TrainingMixin
from .types import ExecutionMode, FineTuneSample, ProposedBatch, StepRecord

# the names below the controller are re-exported: callers import them from here
__all__ = ["MAX_CONSECUTIVE_SAVE_FAILURES", "RETIRED_GRACE_S", "RETIRED_MARK", "CoServer", "CoServeStats",
           "backward_base_model", "delete_retired", "model_on_lent_weights"]

log = logging.getLogger("deltaserve.coserve")

_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


class CoServer(TrainingMixin, PublishingMixin, HostWorkMixin, JobStatusMixin, DataParallelMixin):
    """Co-serve one LoRA fine-tuning job on ``host``. See the module docstring.

    Construction validates the host and loads the dataset (bad records counted and reported; an unusable
    dataset raises before anything starts). :meth:`start` creates the buffer and the backward process and
    installs the hooks, in two parts a server runs on different threads (:meth:`prepare`, :meth:`attach`);
    :meth:`close` removes them and stops the backward process.
    """

    def __init__(self, host: HostHooks, job: JobConfig, *, latency_model: LatencyModel | None = None,
                 calibration: Mapping[str, Any] | None = None, tokenizer: Any = None,
                 backward_threads: int | None = None, hang_timeout_s: float = 120.0,
                 log_every_s: float = 10.0, resume: bool = True, preempt_decode: bool | None = None,
                 admission: AdmissionPolicy | None = None, host_work_deadline_s: float = 2.0,
                 nonfinite_pause_after: int = 3, save_retry_s: float = 30.0, dp_rank: int | None = None) -> None:
        """``latency_model``: a fitted model; without one, :meth:`start` calibrates the host (or reuses its stored
        profile) with ``calibration`` passed to :func:`~deltaserve_core.calibration.load_or_calibrate`, after the
        fine-tuning adapter is loaded so that profiled fine-tuning rows run exactly as admitted ones will.

        ``admission``: the :class:`~deltaserve_core.admission.AdmissionPolicy` (default
        :meth:`~deltaserve_core.admission.AdmissionPolicy.default`; :meth:`~deltaserve_core.admission.AdmissionPolicy.paper`
        is the paper's Algorithm 1). ``host_work_deadline_s``: an adapter install or publish waits for a step whose
        spare time covers its measured cost under the inference margin; once it waited this long, for one that
        covers it under the plain prediction; once it waited twice this long, it runs in the next step whatever the
        cost (counted in ``stats.host_work_forced``), so fine-tuning never waits for ever.
        ``nonfinite_pause_after``: after this many optimizer steps in a row were skipped
        for non-finite values, admission stops (:attr:`CoServeStats.training_paused` says why) until a restart:
        the job's settings (learning rate, data) are then wrong, and training on would only waste the device.
        ``save_retry_s``: once :data:`MAX_CONSECUTIVE_SAVE_FAILURES` saves in a row failed and fine-tuning paused,
        a save is retried this often (from :meth:`poll`); the first that succeeds resumes fine-tuning, so a disk
        that filled up and was cleared needs no restart.
        ``dp_rank``: this replica's rank when the job's ``data_parallel.world_size`` is above 1 (an engine adapter
        passes its own data-parallel rank; without it ``$DELTASERVE_DP_RANK``); see :mod:`.data_parallel`."""
        if not (math.isfinite(save_retry_s) and save_retry_s > 0):
            raise ValueError(f"save_retry_s must be a positive number of seconds, got {save_retry_s!r}")
        self.save_retry_s = save_retry_s
        self._save_retry_at: float | None = None  # set while paused for failed saves
        if nonfinite_pause_after < 1:
            raise ValueError(f"nonfinite_pause_after must be >= 1, got {nonfinite_pause_after!r}")
        self.nonfinite_pause_after = nonfinite_pause_after
        self._nonfinite_streak = 0
        #: (adapter step, tokens) of each optimizer step this controller saw land, so a restart that rewinds to a
        #: checkpoint can drop the steps it will redo from the totals instead of counting them twice
        self._step_log: list[tuple[int, int]] = []
        self.host = host
        self.job = job
        self._dp_setup(dp_rank)  # refuses a data-parallel job without a usable rank before anything starts
        self.caps = validate_host(host)
        self.spec = host.model_spec()
        if latency_model is not None and not latency_model.is_ready:
            raise ValueError("the latency model is not calibrated: run calibration (deltaserve calibrate), pass a "
                             "fitted LatencyModel or none (start() then calibrates); admission without a model "
                             "would be a guess")
        self.model = latency_model if latency_model is not None else LatencyModel()
        self._calibrate = latency_model is None
        self.calibration_kwargs = dict(calibration or {})
        self.calibration_profile: Any = None
        self.dataset = FinetuneDataset(
            DataConfig(path=job.dataset, format=job.dataset_format, max_length=job.max_length,
                       overflow=job.overflow, epochs=job.epochs, seed=job.seed),
            tokenizer if tokenizer is not None else self.spec.path)
        self.dataset.report.log()
        self.pool: FinetunePool = self.dataset.make_pool()
        self.slo = SLOConfig(job.slo.ttft_s, job.slo.tpot_s, job.slo.avg_tpot_s)
        self.slo_monitor = SLOMonitor(self.slo)
        self.policy = admission if admission is not None else AdmissionPolicy.default()
        self.admission = Admission(self.model, self.slo, mixed_batches=self.caps.mixed_batches,
                                   max_ft_tokens_per_step=min(self.caps.max_finetune_tokens_per_step, job.buffer_tokens),
                                   decode_mode=self._decode_mode, policy=self.policy)
        self.stats = CoServeStats()
        #: called with (batch, decision) after every admission decision, on the scheduling thread (a benchmark
        #: logs the prices the policy acted on); must be cheap and must not raise
        self.decision_observers: list[Callable[[ProposedBatch, AdmissionDecision], None]] = []
        self.backward_threads = backward_threads
        self.hang_timeout_s = hang_timeout_s
        self.log_every_s = log_every_s
        self.resume_from_checkpoint = resume  # not `resume`: that is the operator control
        #: pause the backward for decode-only steps too (default: on CPU hosts, where both share cores)
        self.preempt_decode = self.caps.device.startswith("cpu") if preempt_decode is None else preempt_decode
        self.buffer: ActivationBuffer | None = None
        self.backward: BackwardProcess | None = None
        self._admitted: dict[int, tuple[FineTuneSample, ...]] = {}
        self._recovering: threading.Thread | None = None
        self._pending_reports: deque[BackwardReport] = deque()
        self._last_log = time.monotonic()
        self._last_log_tokens = 0
        self._published_step = -1
        self._pending_ids: list[int] = []
        self._pending_tokens = 0
        # the open optimizer step: parts already sent to the backward (accumulate), not yet applied
        self._step_ids: list[int] = []
        self._step_tokens = 0
        pack = job.pack_tokens
        #: an optimizer step is sent in parts of at least this many tokens (None: in one piece, the paper's way)
        self.part_tokens: int | None = pack if 0 < pack < job.backward_batch_tokens else None
        if self.dp is not None:
            self.part_tokens = 1  # every captured step is a part: the ranks' token counter closes global steps
        self._started = False
        # Host calls that cost engine time between two steps (adapter installs and publishes: a safetensors write
        # and an add_lora each), run when a step can absorb them (see _run_host_work); newest per key.
        self._host_work: dict[str, Callable[[], None]] = {}
        self._host_work_since: dict[str, float] = {}
        self._host_work_s: dict[str, deque[float]] = {INSTALL: deque(maxlen=8), PUBLISH: deque(maxlen=8)}
        if not (math.isfinite(host_work_deadline_s) and host_work_deadline_s > 0):
            raise ValueError(f"host_work_deadline_s must be a positive number of seconds, got {host_work_deadline_s!r}")
        self.host_work_deadline_s = host_work_deadline_s
        # why each recent step carried what it did (step id -> AdmissionReason value), for the bench's step log
        self._step_reasons: OrderedDict[int, str] = OrderedDict()
        self._save_ids: set[int] = set()  # command ids of checkpoint saves not yet answered
        self._admission_stopped = False
        #: set by a :class:`~deltaserve_core.job_sharing.JobSharing` while another job holds the fine-tuning rows:
        #: this job's admission then holds with it (its housekeeping, preemption of its backward and its end-of-data
        #: dispatch still run every step); None for a job alone on its host
        self.turn_hold: AdmissionReason | None = None
        #: called with every executed step's record once the controller has handled it, on the host's scheduling
        #: thread, so they must be cheap and must not raise (metrics use this: :mod:`.metrics`)
        self.step_observers: list[Callable[[StepRecord], None]] = []
        self._init_operator_state()

    def _decode_mode(self, batch: ProposedBatch) -> ExecutionMode:
        return self.host.graph_mode(batch)

    # ------------------------------------------------------------------------------------------ lifecycle

    def start(self) -> "CoServer":
        """Create the buffer and the backward process, resume, calibrate and install the hooks: :meth:`prepare`
        then :meth:`attach`, on the thread that steps the host."""
        self.prepare()
        return self.attach()

    def prepare(self) -> "CoServer":
        """The slow part of a start, which touches nothing the host's steps use: the buffer, the backward's base
        model and the backward process, started and resumed from the checkpoint (seconds on a CPU: the child
        imports torch). It may run on another thread while the host serves (a job created over HTTP must not
        stall inference), once; :meth:`attach` follows on the host's thread, or :meth:`close` releases it.

        A failure on the way stops what was started already before it propagates: the backward child ignores
        SIGTERM (see :mod:`.backward_process`), so one left running would keep its parent from ever exiting."""
        if self.backward is not None:
            raise RuntimeError(f"job {self.job_id} is prepared already")
        try:
            self._prepare()
        except BaseException:
            self._release()
            raise
        return self

    def attach(self) -> "CoServer":
        """Join the host after :meth:`prepare`, on the thread that steps it: install the adapter (and republish a
        resumed job's versions), calibrate if no model was given, install the hooks. A failure releases the
        backward as well."""
        if self.backward is None:
            raise RuntimeError(f"job {self.job_id} is not prepared (or was released): call prepare() first")
        try:
            return self._attach()
        except BaseException:
            self._abort_start()
            raise

    def _abort_start(self) -> None:
        for undo in (self.host.intercept_schedule, self.host.capture_activation, self.host.report_step_time):
            try:
                undo(None)
            except Exception:  # noqa: BLE001 - best effort: the original error is what the caller must see
                log.debug("undoing a hook after a failed start", exc_info=True)
        self._release()

    def _release(self) -> None:
        """Stop the backward process and free the buffer of a start that failed or of a job prepared and never
        attached. Touches no hook: it may run on the thread that prepared the job."""
        if self.backward is not None:
            try:
                self.backward.close()
            except Exception:  # noqa: BLE001
                log.exception("stopping the backward process after a failed start")
                self.backward.kill()
        if self.buffer is not None:
            self.buffer.close()
        self.backward = self.buffer = None
        self._started = False

    def _prepare(self) -> None:
        check_writable_dir(self.job.checkpoint.dir, "checkpoint.dir")
        clean_stale_files()
        if self.dp is not None:
            self._dp_start()
        dtype = _DTYPES.get(self.caps.activation_dtype, torch.float32)
        self.buffer = ActivationBuffer(self.spec.num_layers, self.spec.hidden_size, self.job.buffer_tokens,
                                       dtype=dtype, device=self.caps.device)
        base = backward_base_model(self.host, self.spec.path, dtype, self.caps.device)
        adapter = fresh_lora_state(base, self.job.lora, name=self.job.adapter_name, seed=self.job.seed,
                                   base_model_path=self.spec.path)
        self.initial_adapter = adapter.with_tensors({k: v.clone() for k, v in adapter.tensors.items()}, version=0)
        self.backward = BackwardProcess(
            base, adapter, self.buffer,
            config=TrainerConfig(lr=self.job.lr, weight_decay=self.job.weight_decay,
                                 backward_batch_tokens=self.job.backward_batch_tokens,
                                 pack_tokens=self.job.pack_tokens),
            checkpoint_dir=self.checkpoint_dir, keep_checkpoints=self.job.checkpoint.keep,
            hang_timeout_s=self.hang_timeout_s, torch_threads=self.backward_threads, data_parallel=self.dp)
        self.backward.start(resume=self.resume_from_checkpoint)
        ready = self.backward.wait_ready()
        if ready.extra.get("pool") and self.dp is None:
            self.pool.load_state_dict(ready.extra["pool"])
            log.info("resumed fine-tuning from checkpoint at step %d (%s)", ready.step, self.pool.progress_line())
        elif ready.extra.get("pool"):
            self._dp_resume_pool(ready)
        if ready.extra.get("cancelled_at") is not None:
            self._resume_cancelled(ready.step, int(ready.extra["cancelled_at"]))
        self.stats.adapter_step = ready.step

    def _attach(self) -> "CoServer":
        assert self.backward is not None
        step = self.stats.adapter_step  # the step the backward resumed at (prepare)
        snapshot = self.backward.adapter_snapshot(version=step)
        self.host.set_finetune_adapter(snapshot)
        # Installed twice, the second timed: the cost of every later install must be known before the first one is
        # due, or no step could be judged able to absorb it (the first call pays one-time loading costs).
        self._host_work_s[INSTALL].append(timed(lambda: self.host.set_finetune_adapter(snapshot)))
        if step > 0 and self.job.publish.policy != "never":
            self._republish_from_disk(step)
            # a resumed job serves what it has trained, not only what it trains next
            self._host_work_s[PUBLISH].append(timed(lambda: self._publish(step)))
        if self._calibrate:
            from .calibration import load_or_calibrate

            self.calibration_profile = load_or_calibrate(self.host, **self.calibration_kwargs)
            self.model = self.calibration_profile.model
            self.admission.use_model(self.model)
        self.host.intercept_schedule(self)
        self.host.capture_activation(self.buffer)
        self.host.report_step_time(self)
        self.admission.seed_margin()
        self._started = True
        self._progress_origin = (time.monotonic(), float(self.pool.progress()["fraction"]))
        self.events.add("info", f"fine-tuning started on host {getattr(self.host, 'name', '?')!r}"
                        + (f", resumed from the checkpoint at step {step}" if step else ""),
                        data={"step": step, "samples": len(self.dataset), "epochs": self.job.epochs})
        # rates count from here: loading and calibrating took time in which nothing could be trained
        self.stats.started_at = time.monotonic()
        log.info("co-serving %s on host %r: %d samples, %d epoch(s), buffer %d tokens, SLO ttft=%.3fs tpot=%.3fs",
                 self.job.adapter_name, getattr(self.host, "name", "?"), len(self.dataset), self.job.epochs,
                 self.job.buffer_tokens, self.slo.ttft_s, self.slo.tpot_s)
        return self

    def close(self) -> None:
        """Remove the hooks and stop the backward process; a job prepared and never attached is released."""
        if not self._started:
            self._release()
            return
        self.host.intercept_schedule(None)
        self.host.capture_activation(None)
        self.host.report_step_time(None)
        self._started = False
        if self.backward is not None:
            self.backward.stop()
            self.backward.close()
        if self.buffer is not None:
            self.buffer.close()

    @property
    def checkpoint_dir(self) -> str:
        """Where this controller's backward writes checkpoints: ``checkpoint.dir``, or a rank's own folder in it
        (ranks hold identical adapters but their own share of the data)."""
        if self.dp is None:
            return self.job.checkpoint.dir
        import os

        return os.path.join(self.job.checkpoint.dir, f"rank-{self.dp.rank}")

    @property
    def adapter_step(self) -> int:
        """The optimizer step the job's adapter is at: resumed from the checkpoint, rewound by a backward restart."""
        return self.stats.adapter_step

    @property
    def recovering(self) -> bool:
        """Whether the backward process is being restarted (admission paused meanwhile)."""
        return self._recovering is not None

    def step_reason(self, step_id: int) -> str | None:
        """Why step ``step_id`` carried the fine-tuning rows it did (an :class:`AdmissionReason` value), for step
        logs; recent steps only, each answered once."""
        return self._step_reasons.pop(step_id, None)

    def shutdown(self, timeout_s: float = 60.0) -> str | None:
        """An operator's stop once the host no longer steps: :meth:`final_checkpoint` (logged), then :meth:`close`,
        even if the checkpoint fails. Returns the checkpoint folder, or None. Used by every engine's server path."""
        try:
            path = self.final_checkpoint(timeout_s=timeout_s)
            if path:
                log.info("DeltaServe final checkpoint: %s", path)
            return path
        finally:
            self.close()

    def __enter__(self) -> "CoServer":
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.close()

    # ------------------------------------------------------------------------------------------ hooks

    @property
    def margin(self) -> SLOMargin | None:
        """The admission's measured margin (None under a policy without one)."""
        return self.admission.margin

    def on_arrival(self, request_id: str, arrival_time: float) -> None:
        if self.buffer is not None and self.policy.interrupt:
            self.buffer.request_abort()

    def stop_admission(self) -> None:
        """Admit no more fine-tuning samples (an operator's stop has begun); training already admitted finishes.
        Safe to call from a signal handler: it only sets a flag the engine thread reads."""
        self._admission_stopped = True

    def on_schedule(self, batch: ProposedBatch) -> Sequence[FineTuneSample]:
        self.poll()
        self.slo_monitor.observe(batch)
        bw = self.backward
        assert bw is not None and self.buffer is not None, "CoServer.start() must run before the host schedules"
        # no admission until the adapter the backward just produced is installed: rows must run on the newest weights
        installed, host_s = self._run_host_work(batch)
        if host_s:
            self.admission.discount_gap(host_s)
        # A step whose spare time just went to host work takes no fine-tuning rows: its decodes already waited for
        # that work, and the batch's budget was computed before it ran (an install followed by a mixed step took
        # the token gap past TPOT on the H200).
        pause: AdmissionReason | None = (AdmissionReason.BACKWARD_RECOVERING if self._recovering is not None
                                         else AdmissionReason.TRAINING_PAUSED
                                         if self.stats.training_paused or self.stats.paused_reason
                                         or self._admission_stopped or self._operator_paused
                                         else AdmissionReason.BACKWARD_RUNNING
                                         if bw.busy or (self.dp is not None and self._dp_step_full())
                                         else AdmissionReason.INSTALL_PENDING if not installed
                                         else AdmissionReason.HOST_WORK_IN_STEP if host_s and not batch.is_empty
                                         else None)
        if batch.is_empty:
            self.buffer.clear_abort()
            if pause is None and len(self.pool) == 0 and (self._pending_ids or self._step_ids):
                if self.dp is not None:
                    self._dp_maybe_close()
                else:
                    self._dispatch_backward()  # end of the data: train the partial batch rather than wait for more
                pause = AdmissionReason.BACKWARD_RUNNING
        decision = self.admission.decide(batch, pool=self.pool, buffer_free_tokens=self.buffer.free_tokens,
                                         hold=pause if pause is not None else self.turn_hold)
        for observe in self.decision_observers:
            observe(batch, decision)
        reason = decision.reason.value
        self.stats.admission_reasons[reason] += 1
        self._step_reasons[batch.step_id] = reason
        if len(self._step_reasons) > 4096:
            self._step_reasons.popitem(last=False)
        samples = decision.samples
        if batch.has_prefill or (not batch.is_empty and (self.preempt_decode or samples)):
            # Paper §3.4: prefill reclaims the device from the backward within one layer. Where inference and
            # training share CPU cores, decode steps must reclaim it too, or their TPOT pays for the backward. So do
            # decode steps carrying fine-tuning rows (now that parts of a step train while later ones are
            # forwarded): they are priced from calibration without a backward beside them, and with one beside
            # them they ran well over that price on a GPU (docs/benchmarks.md).
            bw.grant.clear()
        if samples:
            kept = []
            for s in samples:
                if self.buffer.reserve(s) is None:  # fragmentation: the rest goes back, admission stays exact
                    self.pool.release([x.sample_id for x in samples[len(kept):]])
                    break
                kept.append(s)
            samples = tuple(kept)
            if not samples:
                self.admission.rows_returned(batch, decision)
        if samples:
            self._admitted[batch.step_id] = samples
            if self.dp is not None:
                # admission waits for every install, so the host runs these on the adapter of this step
                self._admitted_version[batch.step_id] = self.stats.adapter_step
            if batch.is_empty:
                self.buffer.mark_finetune_only(batch.step_id)
        return samples

    def __call__(self, record: StepRecord) -> None:
        """StepSink: one record per executed step."""
        if self.backward is not None:
            self.backward.grant.set()
        if record.synthetic:
            self.model.observe(record)
            return
        self.stats.steps += 1
        predicted = self.admission.observe(record)
        if predicted is not None and record.duration_s > 0:
            self.stats.estimator_errors[record.mode.value].append(abs(predicted - record.duration_s) / record.duration_s)
        self.model.observe(record)
        admitted = self._admitted.pop(record.step_id, ())
        if record.aborted_sample_ids:
            self.stats.aborted_samples += len(record.aborted_sample_ids)
            # Rows the host refused to place never reached its forward side, so no end_step freed their slots or
            # the step's fine-tuning-only marker; for rows the forward did abort this is a no-op.
            self.buffer.end_step(record.step_id, (), record.aborted_sample_ids)  # type: ignore[union-attr]
            self.pool.release(list(record.aborted_sample_ids))
        if record.finetune_sample_ids:
            self.stats.steps_with_finetune += 1
            if not record.prefill_lengths and not record.num_decode:
                self.stats.finetune_only_steps += 1
            self.stats.admitted_samples += len(record.finetune_sample_ids)
            self.stats.forward_tokens += record.finetune_tokens
            if self.dp is not None and self.backward is not None:
                self._dp_dispatch(record)
            elif self.backward is not None and self._recovering is None:
                self._pending_ids.extend(record.finetune_sample_ids)
                self._pending_tokens += record.finetune_tokens
                if self._pending_tokens + self._step_tokens >= self.job.backward_batch_tokens:
                    self._dispatch_backward()
                elif self.part_tokens is not None and self._pending_tokens >= self.part_tokens:
                    self._dispatch_backward(close=False)
        missing = {s.sample_id for s in admitted} - set(record.finetune_sample_ids) - set(record.aborted_sample_ids)
        if missing:  # the host dropped rows it was given: give them back rather than lose them
            log.warning("host %r did not run admitted samples %s in step %d; returning them to the pool",
                        getattr(self.host, "name", "?"), sorted(missing), record.step_id)
            for sid in missing:
                self.buffer.release(sid)  # type: ignore[union-attr]
            self.pool.release(sorted(missing))
        for observe in self.step_observers:
            observe(record)
        self._maybe_log()

    def observe_foreign_step(self, record: StepRecord) -> None:
        """StepSink for a step that carried another job's fine-tuning rows (:mod:`.job_sharing`): the latency model
        learns from it (latency is the host's, whoever's rows ran), nothing else here does: the samples are not
        this job's and its admission priced the step without them."""
        if self.backward is not None:
            self.backward.grant.set()
        self.admission.forget(record.step_id)
        self.model.observe(record)

    @property
    def ready_for_rows(self) -> bool:
        """Whether this job would admit fine-tuning rows if it held them now (:mod:`.job_sharing` hands them only to
        such jobs): started, not failed, paused, stopping or recovering, its backward not applying an optimizer step
        (Algorithm 1, line 2), samples left and room in its buffer."""
        bw, buf = self.backward, self.buffer
        return self.backlogged and bw is not None and not bw.busy and buf is not None and buf.free_tokens > 0

    @property
    def backlogged(self) -> bool:
        """Whether this job has samples to train and may train them: started, not failed, paused, stopping or
        recovering (its backward may be busy). :mod:`.job_sharing` keeps a job's fair-share credit across the
        steps its backward runs, not across a pause."""
        return (self._started and self.backward is not None and self._failed is None and self._recovering is None
                and not self._admission_stopped and not self._operator_paused and self.stats.training_paused is None
                and self.stats.paused_reason is None and len(self.pool) > 0)

    def poll(self) -> None:
        """Housekeeping between steps (hosts call nothing extra; the demo and tests may call it when idle)."""
        self.finish_recovery(0.0)
        self._absorb_backward()
        self._maybe_retry_save()
        self._advance_cancel()
        if self.dp is not None and self._started and self._share_trained():
            self._dp_mark_done()

    # ------------------------------------------------------------------------------------------ progress

    @property
    def finished(self) -> bool:
        bw = self.backward
        # pending host work (the last install or publish) keeps the job unfinished, so hosts keep offering the
        # idle step it runs in
        if self.stats.paused_reason is not None or self.stats.training_paused is not None:
            return not self._host_work  # nothing more will be trained: let idle hosts stop stepping
        # a rank whose share is trained still applies (and publishes) the global steps of the others' shares
        return self._share_trained() and (self.dp is None or self._dp_all_done())

    def _share_trained(self) -> bool:
        """Every sample of this controller's pool (a rank's share, under data parallelism) is trained and applied,
        and the host has the result."""
        bw = self.backward
        return (self.pool.finished and bw is not None and not bw.busy and not bw.accumulating
                and not self._pending_ids and not self._step_ids and self._recovering is None and not self._host_work)

    def _maybe_log(self) -> None:
        now = time.monotonic()
        if now - self._last_log < self.log_every_s:
            return
        # the window opens at the last line, or when training started if that is later (the first line)
        window_s = now - max(self._last_log, self.stats.started_at)
        window_tokens = max(0, self.stats.trained_tokens - self._last_log_tokens)  # a rewind can lower the total
        self._last_log, self._last_log_tokens = now, self.stats.trained_tokens
        d = self.stats.as_dict()
        mape = ", ".join(f"{m} {v * 100:.1f}%" for m, v in d["estimator_mape"].items() if v is not None) or "n/a"
        slo = self.slo_monitor.attainment()
        seen = (f"SLO attainment {slo['slo'] * 100:.1f}% of {slo['requests']} requests" if slo["slo"] is not None
                else "no client request yet")
        # "step N": the adapter's step, which a resumed job continues (parsers key on this prefix)
        log.info("fine-tuning: step %d (%d this run), loss %s, %.1f trained tok/s since start (%d tokens in %.1f s), "
                 "%.1f in the last %.1f s, %d samples admitted (%d aborted), %s, estimator error %s (admission "
                 "margin x%.2f, -%.1f ms), %s", d["adapter_step"], d["optimizer_steps"],
                 f"{d['last_loss']:.4f}" if d["last_loss"] is not None else "n/a", d["finetune_tokens_per_s"],
                 d["trained_tokens"], d["finetune_seconds"], window_tokens / max(window_s, 1e-9), window_s,
                 d["admitted_samples"], d["aborted_samples"], seen, mape, self.admission.safety,
                 self.admission.overhead_s * 1e3, self.pool.progress_line())
        if self.dp is not None:
            st = self._dp_status()
            last = st["last_global_step"] or {}
            log.info("data parallel: rank %d of %d; last global step: sequence %s, ranks %s, %s tokens; trained "
                     "tokens by rank since start %s (all ranks %d); %d stale parts re-admitted", st["rank"],
                     st["world_size"], last.get("seq"), last.get("ranks"), last.get("tokens"),
                     st["trained_tokens_by_rank"], st["trained_tokens_all_ranks"], st["stale_parts"])
        if self.stats.save_failures or self.stats.paused_reason:
            # repeated in every progress line: a failing folder must not scroll out of sight after one error
            log.warning("fine-tuning: %d checkpoint saves failed (%d in a row)%s", self.stats.save_failures,
                        self.stats.consecutive_save_failures,
                        f"; PAUSED: {self.stats.paused_reason}" if self.stats.paused_reason else "")
