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
"""

from __future__ import annotations

import logging
import math
import shutil
import threading
import time
from collections import Counter, OrderedDict, deque
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from .activation_buffer import ActivationBuffer
from .adapter_state import LoraAdapterState, all_finite, fresh_lora_state
from .admission import Admission, AdmissionDecision, AdmissionReason
from .backward_process import BackwardProcess, BackwardProcessError, BackwardReport
from .checkpoint import check_writable_dir
from .cleanup import clean_stale_files
from .finetune_data import DataConfig, FinetuneDataset, FinetunePool
from .hooks import HostHooks, validate_host
from .hostkit import parse_published_name, publish_dir
from .job_config import JobConfig
from .job_control import EventLog, JobCallError, job_id
from .latency_model import Equation, LatencyModel
from .lora_backward import TrainerConfig
from .slo import SLOConfig, SLOMonitor
from .slo_margin import SLOMargin
from .types import ExecutionMode, FineTuneSample, ProposedBatch, StepRecord

__all__ = ["RETIRED_MARK", "CoServer", "CoServeStats", "delete_retired"]

_INSTALL, _PUBLISH = "install", "publish"
#: checkpoint saves in a row that may fail before fine-tuning pauses (inference is not affected)
MAX_CONSECUTIVE_SAVE_FAILURES = 3

log = logging.getLogger("deltaserve.coserve")

_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


@dataclass
class CoServeStats:
    """Running totals the controller logs and the demo/benchmarks report.

    Counts are of this run (a resumed job starts them at 0); ``adapter_step`` is the adapter's own optimizer step,
    counted from the job's first run. ``finetune_tokens_per_s`` in :meth:`as_dict` is *trained tokens per second
    since fine-tuning started*: ``trained_tokens`` over the seconds since ``started_at``, which
    :meth:`CoServer.start` sets once the job can train (model loads and calibration excluded). The progress line
    and the demo's summary both report that figure under that name."""

    started_at: float = field(default_factory=time.monotonic)
    adapter_step: int = 0
    steps: int = 0
    steps_with_finetune: int = 0
    finetune_only_steps: int = 0
    admitted_samples: int = 0
    aborted_samples: int = 0
    forward_tokens: int = 0
    trained_tokens: int = 0
    optimizer_steps: int = 0
    losses: list[float] = field(default_factory=list)
    trained_batches: list[tuple[int, ...]] = field(default_factory=list)  # sample ids of each optimizer step
    backward_failures: int = 0
    #: optimizer steps skipped because their loss, gradients or new weights were not finite (adapter unchanged)
    nonfinite_skipped: int = 0
    #: publishes refused because the snapshot held NaN or infinite values
    publish_refused: int = 0
    #: publishes that failed writing the version's folder (a full or unwritable disk)
    publish_failures: int = 0
    #: optimizer steps trained again after a backward restart rewound to an older checkpoint
    redone_steps: int = 0
    #: their tokens, taken off ``trained_tokens`` by the rewind: ``trained_tokens + redone_tokens`` never decreases
    redone_tokens: int = 0
    #: adapter versions published by this process (``published`` is pruned to ``checkpoint.keep``)
    publishes: int = 0
    #: why fine-tuning stopped admitting samples (None while it runs): an operator has to look
    training_paused: str | None = None
    #: checkpoint saves that failed (unwritable or full folder); consecutive ones pause training (see CoServer)
    save_failures: int = 0
    consecutive_save_failures: int = 0
    #: why training is paused because saves fail (None: it is not); shown in status so an operator sees it.
    #: Cleared by the first save that succeeds again (the controller retries, see CoServer's save_retry_s)
    paused_reason: str | None = None
    # the last 512 relative errors per mode: what the MAPE is reported over, without growing per step
    estimator_errors: dict[str, deque[float]] = field(
        default_factory=lambda: {"graph": deque(maxlen=512), "eager": deque(maxlen=512)})
    published: list[str] = field(default_factory=list)
    checkpoints: list[str] = field(default_factory=list)
    #: every admission decision by its reason (AdmissionReason values): why a step carried no fine-tuning rows
    admission_reasons: Counter[str] = field(default_factory=Counter)
    #: deferred host work (adapter installs, publishes) run, by kind; ``forced``: run past the hard deadline
    host_work_runs: Counter[str] = field(default_factory=Counter)
    host_work_forced: int = 0
    #: parts of optimizer steps sent to the backward while the step was still being forwarded
    backward_parts: int = 0
    host_work_max_wait_s: float = 0.0

    def estimator_mape(self, mode: str) -> float | None:
        errs = self.estimator_errors[mode]
        return sum(errs) / len(errs) if errs else None

    def as_dict(self) -> dict[str, Any]:
        elapsed = max(time.monotonic() - self.started_at, 1e-9)
        return {
            "adapter_step": self.adapter_step, "finetune_seconds": elapsed,
            "steps": self.steps, "steps_with_finetune": self.steps_with_finetune,
            "finetune_only_steps": self.finetune_only_steps, "admitted_samples": self.admitted_samples,
            "aborted_samples": self.aborted_samples, "forward_tokens": self.forward_tokens,
            "trained_tokens": self.trained_tokens, "optimizer_steps": self.optimizer_steps,
            "finetune_tokens_per_s": self.trained_tokens / elapsed,
            "first_loss": self.losses[0] if self.losses else None, "last_loss": self.losses[-1] if self.losses else None,
            "losses": list(self.losses),
            "backward_failures": self.backward_failures, "nonfinite_skipped": self.nonfinite_skipped,
            "publish_refused": self.publish_refused, "publish_failures": self.publish_failures,
            "redone_steps": self.redone_steps, "redone_tokens": self.redone_tokens, "publishes": self.publishes,
            "training_paused": self.training_paused,
            "save_failures": self.save_failures, "consecutive_save_failures": self.consecutive_save_failures,
            "paused_reason": self.paused_reason,
            "estimator_mape": {m: self.estimator_mape(m) for m in self.estimator_errors},
            "published": list(self.published), "checkpoints": list(self.checkpoints),
            "admission_reasons": dict(self.admission_reasons), "host_work_runs": dict(self.host_work_runs),
            "host_work_forced": self.host_work_forced, "host_work_max_wait_s": self.host_work_max_wait_s,
            "backward_parts": self.backward_parts,
        }


#: file in a published version's folder once it is pruned: clients can no longer request it
RETIRED_MARK = ".retired"
#: how long a retired version's folder stays for requests that were already running on it
RETIRED_GRACE_S = 600.0


def delete_retired(root: Path, grace_s: float = RETIRED_GRACE_S) -> list[Path]:
    """Delete published folders retired more than ``grace_s`` ago; returns them."""
    gone = []
    now = time.time()
    for mark in root.glob(f"*/{RETIRED_MARK}") if root.is_dir() else ():
        try:
            if now - mark.stat().st_mtime >= grace_s:
                shutil.rmtree(mark.parent, ignore_errors=True)
                gone.append(mark.parent)
        except OSError:
            continue
    return gone




class CoServer:
    """Co-serve one LoRA fine-tuning job on ``host``. See the module docstring.

    Construction validates the host and loads the dataset (bad records counted and reported; an unusable
    dataset raises before anything starts). :meth:`start` creates the buffer and the backward process and
    installs the hooks; :meth:`close` removes them and stops the backward process.
    """

    def __init__(self, host: HostHooks, job: JobConfig, *, latency_model: LatencyModel | None = None,
                 calibration: Mapping[str, Any] | None = None, tokenizer: Any = None,
                 backward_threads: int | None = None, hang_timeout_s: float = 120.0,
                 log_every_s: float = 10.0, resume: bool = True, preempt_decode: bool | None = None,
                 safety_quantile: float | None = 1.0, cap_extension: bool = True,
                 cap_to_calibration: bool = True, host_work_deadline_s: float = 2.0,
                 nonfinite_pause_after: int = 3, save_retry_s: float = 30.0) -> None:
        """``latency_model``: a fitted model; without one, :meth:`start` calibrates the host (or reuses its stored
        profile) with ``calibration`` passed to :func:`~deltaserve_core.calibration.load_or_calibrate`, after the
        fine-tuning adapter is loaded so that profiled fine-tuning rows run exactly as admitted ones will.

        ``safety_quantile``: admission holds a step with inference to (Δ − overhead) / safety, both measured by
        :class:`~deltaserve_core.slo_margin.SLOMargin` at this quantile (1, the default: the maximum over its
        window) of measured ÷ predicted duration of recent mixed steps and of the host's time between steps.
        ``None`` keeps safety 1 and overhead 0, the paper's rule. ``cap_extension``: fine-tuning
        rows lengthen a step with inference by at most the fine-tuning-only budget (see
        :mod:`~deltaserve_core.admission`); ``False`` is the paper's rule. ``cap_to_calibration``: admit no more
        fine-tuning tokens per step than calibration measured (``False``: the host's and the buffer's limits
        only, the paper's rule). ``host_work_deadline_s``: an adapter install or publish waits for a step whose
        spare time covers its measured cost under the inference margin; once it waited this long, for one that
        covers it under the plain prediction; once it waited twice this long, it runs in the next step whatever the
        cost (counted in ``stats.host_work_forced``), so fine-tuning never waits for ever.
        ``nonfinite_pause_after``: after this many optimizer steps in a row were skipped
        for non-finite values, admission stops (:attr:`CoServeStats.training_paused` says why) until a restart:
        the job's settings (learning rate, data) are then wrong, and training on would only waste the device.
        ``save_retry_s``: once :data:`MAX_CONSECUTIVE_SAVE_FAILURES` saves in a row failed and fine-tuning paused,
        a save is retried this often (from :meth:`poll`); the first that succeeds resumes fine-tuning, so a disk
        that filled up and was cleared needs no restart."""
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
        self.admission = Admission(self.model, self.slo, mixed_batches=self.caps.mixed_batches,
                                   max_ft_tokens_per_step=min(self.caps.max_finetune_tokens_per_step, job.buffer_tokens),
                                   decode_mode=self._decode_mode, cap_extension=cap_extension)
        self.stats = CoServeStats()
        if safety_quantile is not None and not 0.5 < safety_quantile <= 1.0:
            raise ValueError(f"safety_quantile must be in (0.5, 1] or None (the paper's rule), got {safety_quantile!r}")
        self.safety_quantile = safety_quantile
        self.margin = SLOMargin(quantile=safety_quantile) if safety_quantile is not None else None
        # the Admission this CoServer built: callers may wrap ``self.admission`` (benchmarks do), the margin
        # belongs to the core rule underneath
        self._core_admission = self.admission
        self.cap_to_calibration = cap_to_calibration
        self._cap_to_calibration()
        self.backward_threads = backward_threads
        self.hang_timeout_s = hang_timeout_s
        self.log_every_s = log_every_s
        self.resume_from_checkpoint = resume  # not `resume`: that is the operator control
        #: pause the backward for decode-only steps too (default: on CPU hosts, where both share cores)
        self.preempt_decode = self.caps.device.startswith("cpu") if preempt_decode is None else preempt_decode
        self.buffer: ActivationBuffer | None = None
        self.backward: BackwardProcess | None = None
        self._predicted: dict[int, tuple[float, ExecutionMode]] = {}
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
        self._started = False
        # Host calls that cost engine time between two steps (adapter installs and publishes: a safetensors write
        # and an add_lora each), run when a step can absorb them (see _run_host_work); newest per key.
        self._host_work: dict[str, Callable[[], None]] = {}
        self._host_work_since: dict[str, float] = {}
        self._host_work_s: dict[str, deque[float]] = {_INSTALL: deque(maxlen=8), _PUBLISH: deque(maxlen=8)}
        if not (math.isfinite(host_work_deadline_s) and host_work_deadline_s > 0):
            raise ValueError(f"host_work_deadline_s must be a positive number of seconds, got {host_work_deadline_s!r}")
        self.host_work_deadline_s = host_work_deadline_s
        # why each recent step carried what it did (step id -> AdmissionReason value), for the bench's step log
        self._step_reasons: OrderedDict[int, str] = OrderedDict()
        self._save_ids: set[int] = set()  # command ids of checkpoint saves not yet answered
        self._admission_stopped = False
        #: called with every executed step's record once the controller has handled it, on the host's scheduling
        #: thread, so they must be cheap and must not raise (metrics use this: :mod:`.metrics`)
        self.step_observers: list[Callable[[StepRecord], None]] = []
        self._init_operator_state()

    def _init_operator_state(self) -> None:
        """The operator's controls (pause, resume, cancel) and what the jobs API reports (see job_control)."""
        self.job_id = job_id(self.job.adapter_name)
        self.events = EventLog()
        self.created_at = int(time.time())
        self._operator_paused = False
        self._paused_since: float | None = None
        self._paused_total_s = 0.0
        self._cancel_requested = False
        self._cancel_cmd: int | None = None
        self._cancel_retry_at = 0.0
        self._cancelled_at: int | None = None
        self._finished_at: int | None = None
        self._failed: str | None = None
        self._progress_origin: tuple[float, float] | None = None  # (monotonic, fraction done) when training began
        self._checkpoint_log: list[dict[str, Any]] = []
        self._published_log: dict[str, dict[str, Any]] = {}
        self._step_losses: dict[int, float | None] = {}

    def _decode_mode(self, batch: ProposedBatch) -> ExecutionMode:
        return self.host.graph_mode(batch)

    # ------------------------------------------------------------------------------------------ lifecycle

    def start(self) -> "CoServer":
        """Create the buffer and the backward process, resume, calibrate and install the hooks.

        A failure on the way stops what was started already before it propagates: the backward child ignores
        SIGTERM (see :mod:`.backward_process`), so one left running would keep its parent from ever exiting."""
        try:
            return self._start()
        except BaseException:
            self._abort_start()
            raise

    def _abort_start(self) -> None:
        for undo in (self.host.intercept_schedule, self.host.capture_activation, self.host.report_step_time):
            try:
                undo(None)
            except Exception:  # noqa: BLE001 - best effort: the original error is what the caller must see
                log.debug("undoing a hook after a failed start", exc_info=True)
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

    def _start(self) -> "CoServer":
        check_writable_dir(self.job.checkpoint.dir, "checkpoint.dir")
        clean_stale_files()
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
            checkpoint_dir=self.job.checkpoint.dir, keep_checkpoints=self.job.checkpoint.keep,
            hang_timeout_s=self.hang_timeout_s, torch_threads=self.backward_threads)
        self.backward.start(resume=self.resume_from_checkpoint)
        ready = self.backward.wait_ready()
        if ready.extra.get("pool"):
            self.pool.load_state_dict(ready.extra["pool"])
            log.info("resumed fine-tuning from checkpoint at step %d (%s)", ready.step, self.pool.progress_line())
        self.stats.adapter_step = ready.step
        snapshot = self.backward.adapter_snapshot(version=ready.step)
        self.host.set_finetune_adapter(snapshot)
        # Installed twice, the second timed: the cost of every later install must be known before the first one is
        # due, or no step could be judged able to absorb it (the first call pays one-time loading costs).
        self._host_work_s[_INSTALL].append(_timed(lambda: self.host.set_finetune_adapter(snapshot)))
        if ready.step > 0 and self.job.publish.policy != "never":
            self._republish_from_disk(ready.step)
            # a resumed job serves what it has trained, not only what it trains next
            self._host_work_s[_PUBLISH].append(_timed(lambda: self._publish(ready.step)))
        if self._calibrate:
            from .calibration import load_or_calibrate

            self.calibration_profile = load_or_calibrate(self.host, **self.calibration_kwargs)
            self.model = self.calibration_profile.model
            self.admission.model = self.model
            self._cap_to_calibration()
        self.host.intercept_schedule(self)
        self.host.capture_activation(self.buffer)
        self.host.report_step_time(self)
        if self.margin is not None:
            # until co-served steps are measured, trust the calibration's own tail error on eager prefill steps
            quality = self.model.equation_quality(ExecutionMode.EAGER, Equation.PREFILL)
            self.margin.seed(quality.p95_ape if quality is not None else None)
            self._core_admission.safety = self.margin.factor
        self._started = True
        self._progress_origin = (time.monotonic(), float(self.pool.progress()["fraction"]))
        self.events.add("info", f"fine-tuning started on host {getattr(self.host, 'name', '?')!r}"
                        + (f", resumed from the checkpoint at step {ready.step}" if ready.step else ""),
                        data={"step": ready.step, "samples": len(self.dataset), "epochs": self.job.epochs})
        # rates count from here: loading and calibrating took time in which nothing could be trained
        self.stats.started_at = time.monotonic()
        log.info("co-serving %s on host %r: %d samples, %d epoch(s), buffer %d tokens, SLO ttft=%.3fs tpot=%.3fs",
                 self.job.adapter_name, getattr(self.host, "name", "?"), len(self.dataset), self.job.epochs,
                 self.job.buffer_tokens, self.slo.ttft_s, self.slo.tpot_s)
        return self

    def _cap_to_calibration(self) -> None:
        """Admit no more fine-tuning tokens per step than calibration measured (see
        :meth:`~deltaserve_core.latency_model.LatencyModel.calibrated_finetune_tokens`): a step the model only
        extrapolates to is priced by a guess, and the SLO margin learns that only after it overran."""
        if not self.cap_to_calibration:
            return
        most = self.model.calibrated_finetune_tokens() if self.model.is_ready else None
        if most is not None and most < self._core_admission.max_ft_tokens_per_step:
            log.info("fine-tuning tokens per step capped at %d, the most the calibration measured (was %d)",
                     most, self._core_admission.max_ft_tokens_per_step)
            self._core_admission.max_ft_tokens_per_step = most

    def close(self) -> None:
        if not self._started:
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

    def final_checkpoint(self, timeout_s: float = 120.0) -> str | None:
        """Checkpoint the adapter and the data position now (an operator's shutdown); returns the folder written.

        Call it once the host no longer steps. A training batch already running finishes first, so its optimizer
        step is kept (if it takes longer than ``timeout_s`` it is cancelled: the adapter stays as it was and its
        samples stay admissible). Captures not yet trained are dropped; the pool state records only trained
        samples, so a resumed job admits those again. ``None`` when there is no healthy backward process."""
        bw = self.backward
        if not self._started or bw is None or self._recovering is not None:
            return None
        deadline = time.monotonic() + timeout_s
        bw.grant.set()  # nothing is stepping any more: the backward may use the device

        def absorb() -> bool:
            for rep in bw.poll(timeout=0.05):
                if rep.kind == "died":
                    log.error("no final checkpoint: the backward process died (%s)", rep.message)
                    return False
                self._handle(rep)
            return True

        while bw.busy:
            if time.monotonic() > deadline:
                log.warning("the running backward batch did not finish within %.0f s; cancelling it", timeout_s)
                bw.cancel_current()
                deadline = time.monotonic() + timeout_s
                break
            if not absorb():
                return None
        before = len(self.stats.checkpoints)
        failures = self.stats.save_failures
        self._save(bw)
        while len(self.stats.checkpoints) == before:
            if not absorb():
                return None
            if self.stats.save_failures != failures:
                log.error("no final checkpoint: saving it failed (see the error above)")
                return None
            if time.monotonic() > deadline:
                log.error("no final checkpoint: the backward process did not write it within %.0f s", timeout_s)
                return None
        path = self.stats.checkpoints[-1]
        self.flush_host_work()  # the host no longer steps: nobody waits on the install or the final publish
        log.info("final checkpoint at step %d: %s", self.stats.adapter_step, path)
        return path

    def flush_host_work(self) -> None:
        """Run the deferred adapter install and publish now (callers that know no request waits: shutdown, tests)."""
        for key in (_INSTALL, _PUBLISH):
            if key in self._host_work:
                self._run_one(key)

    def _run_one(self, key: str) -> float:
        work = self._host_work.pop(key)
        waited = time.monotonic() - self._host_work_since.pop(key)
        self.stats.host_work_max_wait_s = max(self.stats.host_work_max_wait_s, waited)
        took = _timed(work)
        self._host_work_s[key].append(took)
        self.stats.host_work_runs[key] += 1
        return took

    def _defer(self, key: str, work: Callable[[], None]) -> None:
        """Queue host work; a newer call of the same kind replaces the older one but keeps its waiting time."""
        self._host_work[key] = work
        self._host_work_since.setdefault(key, time.monotonic())

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

    def on_arrival(self, request_id: str, arrival_time: float) -> None:
        if self.buffer is not None:
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
        if host_s and self.margin is not None:
            self.margin.discount_gap(host_s)
        # A step whose spare time just went to host work takes no fine-tuning rows: its decodes already waited for
        # that work, and the batch's budget was computed before it ran (an install followed by a mixed step took
        # the token gap past TPOT on the H200).
        pause: AdmissionReason | None = (AdmissionReason.BACKWARD_RECOVERING if self._recovering is not None
                                         else AdmissionReason.TRAINING_PAUSED
                                         if self.stats.training_paused or self.stats.paused_reason
                                         or self._admission_stopped or self._operator_paused
                                         else AdmissionReason.BACKWARD_RUNNING if bw.busy
                                         else AdmissionReason.INSTALL_PENDING if not installed
                                         else AdmissionReason.HOST_WORK_IN_STEP if host_s and not batch.is_empty
                                         else None)
        if batch.is_empty:
            self.buffer.clear_abort()
            if pause is None and len(self.pool) == 0 and (self._pending_ids or self._step_ids):
                self._dispatch_backward()  # end of the data: train the partial batch rather than wait for more
                pause = AdmissionReason.BACKWARD_RUNNING
        decision: AdmissionDecision = self.admission.decide(
            batch, pool=self.pool, backward_running=pause is not None, buffer_free_tokens=self.buffer.free_tokens)
        reason = pause.value if pause is not None else decision.reason.value
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
        if samples:
            self._admitted[batch.step_id] = samples
            if batch.is_empty:
                self.buffer.mark_finetune_only(batch.step_id)
            self._predicted[batch.step_id] = (decision.predicted_mixed or 0.0, ExecutionMode.EAGER)
        elif not batch.is_empty and self.model.is_ready:
            self._predicted[batch.step_id] = (decision.predicted_inference, batch.mode)
        return samples

    def __call__(self, record: StepRecord) -> None:
        """StepSink: one record per executed step."""
        if self.backward is not None:
            self.backward.grant.set()
        if record.synthetic:
            self.model.observe(record)
            return
        self.stats.steps += 1
        entry = self._predicted.pop(record.step_id, None)
        predicted = entry[0] if entry is not None and entry[0] == entry[0] else None  # NaN: unpriced
        if predicted is not None and record.duration_s > 0:
            self.stats.estimator_errors[record.mode.value].append(abs(predicted - record.duration_s) / record.duration_s)
        if self.margin is not None:
            self.margin.observe(record, predicted)
            self._core_admission.safety = self.margin.factor
            self._core_admission.overhead_s = self.margin.overhead_s
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
            if self.backward is not None and self._recovering is None:
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

    # ------------------------------------------------------------------------------------------ backward

    def _dispatch_backward(self, *, close: bool = True) -> None:
        """Train every captured sample not yet trained, as one optimizer step (``close=False``: send them as a
        part of the open step, which stays open).

        The batch is *all* pending captures, even past ``backward_batch_tokens``: every one of them was forwarded
        with the current adapter, so splitting them across two optimizer steps would train the second part on
        activations computed with stale weights (the paper's batch size is the threshold, not a cut)."""
        assert self.backward is not None
        try:
            if self.part_tokens is None:
                self.backward.train_batch(self._pending_ids)
            else:
                if self._pending_ids:
                    self.backward.accumulate(self._pending_ids)
                    self.stats.backward_parts += 1
                    self._step_ids.extend(self._pending_ids)
                    self._step_tokens += self._pending_tokens
                if close:
                    self.backward.apply()
        except BackwardProcessError as exc:
            # The child died since the last poll: this runs inside the host's step, which must not fail for it.
            # Recover exactly as poll() would have; the restart returns untrained captures to the pool.
            self._recover(f"backward process died ({exc})")
            return
        self._pending_ids = []
        self._pending_tokens = 0

    def _absorb_backward(self) -> None:
        bw = self.backward
        if bw is None or self._recovering is not None:
            return
        for rep in bw.poll():
            self._handle(rep)
        h = bw.health()
        if h.hung:
            self._recover(f"backward process hung (no heartbeat for {h.heartbeat_age_s:.1f} s)")

    def _handle(self, rep: BackwardReport) -> None:
        bw = self.backward
        assert bw is not None
        if rep.kind == "step":
            self._step_ids, self._step_tokens = [], 0
            self.pool.complete(list(rep.sample_ids))
            self._nonfinite_streak = 0
            self._step_log.append((rep.step, rep.tokens))
            self.stats.optimizer_steps += 1
            self.stats.trained_batches.append(tuple(rep.sample_ids))
            self.stats.trained_tokens += rep.tokens
            if rep.loss is not None:
                self.stats.losses.append(rep.loss)
            self.stats.adapter_step = rep.step
            # The next admission must see the new weights (exactness): admission waits until this has run.
            snapshot = bw.adapter_snapshot(version=rep.step)
            self._defer(_INSTALL, lambda: self.host.set_finetune_adapter(snapshot))
            ck = self.job.checkpoint
            if ck.every_steps and rep.step % ck.every_steps == 0:
                self._save(bw)
            pub = self.job.publish
            if pub.policy == "every_n_steps" and rep.step % pub.every_steps == 0:
                self._defer(_PUBLISH, lambda: self._publish(rep.step))
            self._step_losses[rep.step] = rep.loss
            self.events.add("info", f"step {rep.step}: loss {_fmt_loss(rep.loss)}", type="metrics",
                            data={"step": rep.step, "train_loss": rep.loss, "tokens": rep.tokens})
            if self.pool.finished and self._finished_at is None:
                # progress lines follow steps, so none comes after the last one: say that the job is done
                self._finished_at = int(time.time())
                self.events.add("info", f"fine-tuning finished: {self.job.epochs} epoch(s) trained, adapter at step "
                                f"{rep.step}")
                log.info("fine-tuning finished: %d epoch(s) trained, adapter at step %d, %d tokens this run",
                         self.job.epochs, rep.step, self.stats.trained_tokens)
        elif rep.kind == "nonfinite":
            self._skipped_nonfinite(rep)
        elif rep.kind == "checkpoint":
            self._save_ids.discard(rep.cmd_id)
            self.stats.consecutive_save_failures = 0
            if self._save_retry_at is not None:
                log.warning("checkpoint saving works again (%s); fine-tuning resumes", rep.path)
                self.events.add("info", "checkpoint saving works again; fine-tuning resumes")
                self._save_retry_at = None
                self.stats.paused_reason = None
            self.stats.checkpoints.append(str(rep.path))
            self._checkpoint_log.append({"step": rep.step, "path": str(rep.path), "created_at": int(time.time()),
                                         "loss": self._loss_at(rep.step)})
            self.events.add("info", f"checkpoint at step {rep.step}: {rep.path}", data={"step": rep.step})
            if rep.cmd_id == self._cancel_cmd:
                self._cancelled_at = int(time.time())
                self.events.add("info", f"job cancelled; final checkpoint at step {rep.step}")
            if self.job.publish.policy == "on_checkpoint":
                self._defer(_PUBLISH, lambda: self._publish(rep.step))
        elif rep.kind == "error" and rep.cmd_id in self._save_ids:
            self._save_ids.discard(rep.cmd_id)
            self.stats.save_failures += 1
            self.stats.consecutive_save_failures += 1
            n = self.stats.consecutive_save_failures
            log.error("checkpoint save failed (%d in a row, %d in all) in %s: %s", n, self.stats.save_failures,
                      self.job.checkpoint.dir, rep.message)
            self.events.add("error", f"checkpoint save failed ({n} in a row) in {self.job.checkpoint.dir}: "
                            f"{rep.message.strip().splitlines()[-1] if rep.message.strip() else 'no reason given'}")
            if rep.cmd_id == self._cancel_cmd:
                self._cancel_cmd = None  # the cancel's checkpoint is tried again (_advance_cancel)
                self._cancel_retry_at = time.monotonic() + self.save_retry_s
            if n >= MAX_CONSECUTIVE_SAVE_FAILURES and self.stats.paused_reason is None:
                # Training on with nothing durable would lose every step at the next crash, silently.
                self.stats.paused_reason = (
                    f"{n} checkpoint saves in a row failed in {self.job.checkpoint.dir}; fine-tuning paused "
                    f"(inference goes on): fix the folder or free space; a save is retried every "
                    f"{self.save_retry_s:g} s and fine-tuning resumes once one succeeds")
                log.error("TRAINING PAUSED: %s", self.stats.paused_reason)
                self.events.add("error", f"fine-tuning paused: {self.stats.paused_reason}")
            if self.stats.paused_reason is not None:
                self._save_retry_at = time.monotonic() + self.save_retry_s
        elif rep.kind in ("error", "cancelled"):
            log.error("backward process %s (it keeps running): %s", rep.kind, rep.message)
            if self.part_tokens is not None and rep.sample_ids:
                # the child dropped the open step: its samples are admissible again, forwarded anew
                dropped = sorted(set(rep.sample_ids))
                for sid in dropped:
                    self.buffer.release(sid)  # type: ignore[union-attr]
                self.pool.release(dropped)
                gone = set(dropped)
                self._step_ids = [i for i in self._step_ids if i not in gone]
                self._step_tokens = self._step_tokens if self._step_ids else 0
        elif rep.kind == "died":
            self._recover(rep.message)

    def _save(self, bw: BackwardProcess) -> None:
        self._save_ids.add(bw.save_checkpoint(extra=self._checkpoint_extra()))

    def _checkpoint_extra(self) -> dict[str, Any]:
        from .preflight import resume_fields

        # the job's shape goes with the pool, so the next start can refuse an incompatible job before it starts
        return {"pool": self.pool.state_dict(), "job": resume_fields(self.job)}

    def _skipped_nonfinite(self, rep: BackwardReport) -> None:
        """A batch trained into NaN/inf and its step was skipped; pause admission once that keeps happening."""
        # The samples count as consumed: one that yields NaN would yield it again, and retrying it forever
        # would stall the job at that sample.
        self._step_ids, self._step_tokens = [], 0  # an open step sent in parts ended with it
        self.pool.complete(list(rep.sample_ids))
        self.stats.nonfinite_skipped += 1
        self._nonfinite_streak += 1
        log.warning("non-finite optimizer step skipped (%d in a row): %s", self._nonfinite_streak, rep.message)
        self.events.add("warn", f"non-finite optimizer step skipped ({self._nonfinite_streak} in a row): "
                        f"{rep.message}")
        if self._nonfinite_streak >= self.nonfinite_pause_after and self.stats.training_paused is None:
            self.stats.training_paused = (
                f"{self._nonfinite_streak} optimizer steps in a row were not finite (last: {rep.message}); "
                "fine-tuning is paused at the last finite adapter. Lower optimizer.lr or fix the data, then restart")
            log.error("fine-tuning PAUSED: %s", self.stats.training_paused)
            self.events.add("error", f"fine-tuning paused: {self.stats.training_paused}")

    def _rewind_stats(self, step: int) -> None:
        """Totals as of adapter ``step`` (a restart resumed there): the steps after it will be trained again."""
        keep = sum(1 for s, _ in self._step_log if s <= step)
        dropped = self._step_log[keep:]
        del self._step_log[keep:]
        # taken off before they are added back as redone: a reader on another thread (metrics) may see the sum dip
        # for a moment, which it ignores, but never overshoot
        self.stats.optimizer_steps -= len(dropped)
        self.stats.redone_steps += len(dropped)
        self.stats.trained_tokens -= sum(t for _, t in dropped)
        self.stats.redone_tokens += sum(t for _, t in dropped)
        for series in (self.stats.trained_batches, self.stats.losses):
            if len(dropped) and len(series) >= len(dropped):
                del series[len(series) - len(dropped):]

    def _run_host_work(self, batch: ProposedBatch) -> tuple[bool, float]:
        """Run the deferred host calls ``batch`` can absorb; (whether no adapter install is left pending, seconds
        the calls took).

        Installing an adapter version (or publishing one) runs on the engine's thread between two steps, so every
        decode in flight waits for it (tens of ms on a GPU with an 8B model, against a TPOT SLO of ~100 ms). Each
        kind runs in a step nobody waits on (fine-tuning-only or idle), or in one whose spare time covers the
        slowest such call measured recently (:meth:`_fits`), installs first; admission pauses while an install
        waits. The cost is measured at :meth:`start`, and the wait is bounded (``host_work_deadline_s``)."""
        if not self._host_work:
            return True, 0.0
        now = time.monotonic()
        used = 0.0
        for key in (_INSTALL, _PUBLISH):
            if key in self._host_work and self._fits(key, batch, now, used):
                used += self._run_one(key)
        return _INSTALL not in self._host_work, used

    def _fits(self, key: str, batch: ProposedBatch, now: float, used: float) -> bool:
        if batch.is_empty:
            return True
        waited = now - self._host_work_since[key]
        if waited >= 2 * self.host_work_deadline_s:
            self.stats.host_work_forced += 1
            log.warning("%s waited %.1f s for a step with room for it; running it now (host_work_deadline_s=%.1f)",
                        key, waited, self.host_work_deadline_s)
            return True
        cost = max(self._host_work_s[key] or self._host_work_s[_INSTALL], default=0.0)
        # the step is priced with the inference-only margin (it carries no fine-tuning rows); past the deadline
        # with the plain prediction
        safety = 1.0 if self.margin is None or waited >= self.host_work_deadline_s else self.margin.inference_factor
        return self._core_admission.spare_s(batch, safety=safety) - used >= cost

    def _publish(self, step: int) -> None:
        assert self.backward is not None
        if step <= self._published_step:
            return  # two checkpoints of one step (e.g. periodic + final) publish once
        snapshot = self.backward.adapter_snapshot(version=step)
        if not all_finite(snapshot.tensors.values()):
            # clients would get NaN logits under a valid-looking version name
            self.stats.publish_refused += 1
            log.error("not publishing %s@v%d: the adapter holds non-finite values", self.job.adapter_name, step)
            self.events.add("error", f"not published: the adapter at step {step} holds non-finite values")
            return
        try:
            name = self.host.publish_adapter(snapshot)
        except OSError as exc:
            # A full or broken disk under the host's publish folder: this runs inside the host's step, which must
            # not fail for it. The version is not published; the next checkpoint's publish tries again.
            self.stats.publish_failures += 1
            log.error("could not publish %s@v%d: %s", self.job.adapter_name, step, exc)
            self.events.add("error", f"could not publish the adapter at step {step}: {exc}")
            return
        self._published_step = step
        self.stats.publishes += 1
        durable = publish_dir(self.job) / name
        if not (durable / "adapter_config.json").is_file():
            # Hosts that publish into their own temp folder: the copy here is what a restart serves again.
            try:
                snapshot.save_pretrained(durable)
            except OSError as exc:
                log.error("published %s, but could not keep a copy in %s for restarts: %s", name, durable, exc)
        if name in self.stats.published:
            self.stats.published.remove(name)  # republished (a restarted job redoing a step): newest last
        self.stats.published.append(name)
        log.debug("published adapter %s", name)
        self._published_log[name] = {"name": name, "step": step, "loss": self._loss_at(step),
                                     "created_at": int(time.time())}
        self.events.add("info", f"published {name}: request it as model {name!r}", data={"model": name, "step": step})
        self._prune_published()

    def _prune_published(self) -> None:
        """Keep the newest ``checkpoint.keep`` published versions servable; older ones are withdrawn from the host
        (new requests for them are refused) and marked retired, and their folders deleted once retired for
        :data:`RETIRED_GRACE_S`: a request already running on a version may need its folder again (an engine
        reloads an evicted adapter from it, and fails the step if it is gone)."""
        keep = self.job.checkpoint.keep
        root = publish_dir(self.job)
        while len(self.stats.published) > keep:
            name = self.stats.published.pop(0)
            retract = getattr(self.host, "retract_adapter", None)
            if callable(retract):
                try:
                    retract(name)
                except Exception as exc:  # noqa: BLE001 - it is retired anyway; clients get a 404 either way
                    log.warning("host could not withdraw adapter %s: %s", name, exc)
            try:
                (root / name / RETIRED_MARK).touch()
            except OSError:
                pass  # no folder (the host wrote none and the copy failed): nothing to serve or delete
            log.info("retired published adapter %s (checkpoint.keep=%d)", name, keep)
        delete_retired(root)

    def _republish_from_disk(self, resumed_step: int) -> None:
        """Serve again the versions an earlier run of this job published (newest ``checkpoint.keep``)."""
        root = publish_dir(self.job)
        found = []
        for folder in root.glob(f"{self.job.adapter_name}@v*") if root.is_dir() else ():
            tail = folder.name[len(self.job.adapter_name) + 2:]
            if (tail.isdigit() and (folder / "adapter_config.json").is_file() and int(tail) != resumed_step
                    and not (folder / RETIRED_MARK).exists()):
                found.append((int(tail), folder))
        for version, folder in sorted(found)[-self.job.checkpoint.keep:]:
            try:
                state = LoraAdapterState.load_pretrained(folder, name=self.job.adapter_name, version=version)
                name = self.host.publish_adapter(state)
            except Exception as exc:  # noqa: BLE001 - one unreadable folder must not stop the server
                log.warning("could not serve again published adapter %s: %s", folder, exc)
                continue
            self.stats.published.append(name)
            self._published_step = max(self._published_step, version)
        if found:
            log.info("serving again %d adapter versions published before the restart", len(self.stats.published))

    def _recover(self, why: str) -> None:
        """Pause admission and restart the backward process from its newest checkpoint, off the serving path."""
        self.stats.backward_failures += 1
        log.error("%s; admission paused, restarting the backward process from its last checkpoint", why)
        self.events.add("error", f"{why}; restarting the backward process from its last checkpoint")
        bw = self.backward
        assert bw is not None

        def restart() -> None:
            try:
                ck = bw.restart()
                self._pending_reports.append(BackwardReport("recovered", step=ck.step if ck else 0,
                                                            extra=dict(ck.extra) if ck else {}))
            except Exception as exc:  # keep serving; report and stay paused
                log.exception("backward restart failed: %s", exc)
                self._pending_reports.append(BackwardReport("restart_failed", message=str(exc)))

        self._recovering = threading.Thread(target=restart, name="deltaserve-backward-restart", daemon=True)
        self._recovering.start()

    def finish_recovery(self, timeout: float | None = 0.0) -> bool:
        """Complete a restart once its thread ended (called from ``on_schedule``'s path via :meth:`poll`)."""
        t = self._recovering
        if t is None:
            return True
        t.join(timeout)
        if t.is_alive():
            return False
        self._recovering = None
        while self._pending_reports:
            rep = self._pending_reports.popleft()
            if rep.kind == "recovered":
                self.stats.adapter_step = rep.step  # the steps after it are redone: _rewind_stats counts them once
                pool_state = rep.extra.get("pool")
                if pool_state:
                    self.pool.load_state_dict(pool_state)
                else:
                    self.pool = self.dataset.make_pool()
                self._admitted.clear()
                self._pending_ids, self._pending_tokens = [], 0
                self._step_ids, self._step_tokens = [], 0
                # an install queued before the fault belongs to a version the restart may have rewound past
                self._host_work.pop(_INSTALL, None)
                self._host_work_since.pop(_INSTALL, None)
                self._rewind_stats(rep.step)
                assert self.backward is not None
                self.host.set_finetune_adapter(self.backward.adapter_snapshot(version=rep.step))
                log.info("backward process restarted from step %d; fine-tuning resumes", rep.step)
                self.events.add("warn", f"backward process restarted from step {rep.step}; fine-tuning resumes")
                self._failed = None  # an earlier restart failed, this one worked
            elif rep.kind == "restart_failed":
                self._failed = f"the backward process could not be restarted: {rep.message}"
                self.events.add("error", self._failed)
        return True

    def poll(self) -> None:
        """Housekeeping between steps (hosts call nothing extra; the demo and tests may call it when idle)."""
        self.finish_recovery(0.0)
        self._absorb_backward()
        self._maybe_retry_save()
        self._advance_cancel()

    def _maybe_retry_save(self) -> None:
        """While paused for failed saves: try one save every ``save_retry_s`` (the adapter as it stands; nothing
        trains meanwhile). Its answer arrives through :meth:`_handle`, which resumes or re-arms the retry."""
        bw = self.backward
        if (self._save_retry_at is None or time.monotonic() < self._save_retry_at or self._save_ids
                or bw is None or bw.busy or self._recovering is not None or self._admission_stopped):
            return
        self._save_retry_at = time.monotonic() + self.save_retry_s  # re-armed by a failure's answer too
        self._save(bw)

    # ------------------------------------------------------------------------------------------ operator controls
    # Called on the thread that drives the host's steps (under `vllm serve`: a collective_rpc between two engine
    # steps), so they never race on_schedule; none of them blocks a step.

    def pause(self) -> dict[str, Any]:
        """Admit no more fine-tuning samples until :meth:`resume`; returns the job's status.

        Nothing is lost: a backward batch already running finishes and its optimizer step lands, captures not yet
        trained stay in the buffer, the open optimizer step stays open, and the data position is kept. Inference
        is untouched. Raises :class:`JobCallError` (409) for a job that has ended or is being cancelled."""
        self._refuse_if_ended("pause")
        if not self._operator_paused:
            self._operator_paused = True
            self._paused_since = time.monotonic()
            bw = self.backward
            running = bw is not None and bw.busy
            log.info("fine-tuning paused by the operator%s", "; the running backward batch finishes" if running else "")
            self.events.add("info", "fine-tuning paused by the operator"
                            + ("; the running backward batch finishes" if running else ""))
        return self.job_status()

    def resume(self) -> dict[str, Any]:
        """Admit fine-tuning samples again after :meth:`pause` (a no-op on a job that is not paused by the operator);
        returns the job's status. A pause for a fault (failing saves, non-finite steps) is not lifted by this: the
        status says why it remains."""
        self._refuse_if_ended("resume")
        if self._operator_paused:
            self._operator_paused = False
            if self._paused_since is not None:
                self._paused_total_s += time.monotonic() - self._paused_since
                self._paused_since = None
            log.info("fine-tuning resumed by the operator")
            self.events.add("info", "fine-tuning resumed by the operator")
        return self.job_status()

    def cancel(self) -> dict[str, Any]:
        """Stop the job: no more admission, a final checkpoint once a running backward batch has finished, then
        status ``cancelled``. Returns at once (the checkpoint is written by the backward process and noticed
        between later steps); inference is untouched and published versions stay served. Idempotent."""
        if self._cancelled_at is not None or self._cancel_requested:
            return self.job_status()
        self._refuse_if_ended("cancel")
        self._cancel_requested = True
        self._admission_stopped = True
        log.info("fine-tuning cancelled by the operator: writing a final checkpoint")
        self.events.add("info", "cancellation requested: admission stopped, final checkpoint follows")
        self._advance_cancel()
        return self.job_status()

    def _refuse_if_ended(self, op: str) -> None:
        status = self._status()
        if status in ("succeeded", "failed", "cancelled") or (self._cancel_requested and op != "cancel"):
            raise JobCallError(409, f"cannot {op} job {self.job_id}: it is "
                               f"{'being cancelled' if status not in ('succeeded', 'failed', 'cancelled') else status}",
                               code="job_not_active", param="id")

    def _advance_cancel(self) -> None:
        """Write the cancel's checkpoint once nothing trains (the batch running at the cancel keeps its step)."""
        bw = self.backward
        if (not self._cancel_requested or self._cancelled_at is not None or self._cancel_cmd is not None
                or bw is None or not self._started or bw.busy or self._recovering is not None
                or time.monotonic() < self._cancel_retry_at):
            return
        bw.grant.set()  # admission has stopped: the backward may use the device for the save
        self._cancel_cmd = bw.save_checkpoint(extra=self._checkpoint_extra())
        self._save_ids.add(self._cancel_cmd)

    @property
    def wants_steps(self) -> bool:
        """Whether an idle host should keep stepping for this job: not once it has finished, nor while the operator
        paused it and nothing is left in flight (a running batch, a save, an install or publish) -- stepping
        then would only spin."""
        if self.finished:
            return False
        bw = self.backward
        in_flight = (bool(self._host_work) or bool(self._save_ids) or self._recovering is not None
                     or (bw is not None and bw.busy))
        if self._cancelled_at is not None:
            return in_flight
        if self._operator_paused and not self._cancel_requested:
            return in_flight
        return True

    def refresh(self) -> None:
        """Absorb what the backward finished since the last step (a status asked of an idle engine)."""
        if self._started:
            self.poll()

    def _status(self) -> str:
        if self._cancelled_at is not None:
            return "cancelled"
        if self._failed is not None:
            return "failed"
        if not self._started:
            return "validating_files"
        if self._operator_paused or self.stats.paused_reason or self.stats.training_paused:
            return "paused"
        if self._finished_at is not None and self.finished:
            return "succeeded"
        return "running"

    def _trained_tokens(self) -> int:
        # counted by the pool, whose state is in every checkpoint: a resumed job keeps its total
        return int(self.pool.progress()["tokens_completed"])

    def _loss_at(self, step: int) -> float | None:
        """The loss of the newest optimizer step at or before adapter ``step`` this run saw land."""
        seen = [s for s in self._step_losses if s <= step]
        return self._step_losses[max(seen)] if seen else None

    def _estimated_finish(self, fraction: float) -> int | None:
        """Unix time the job should end at its rate so far (time paused not counted); None while it cannot tell."""
        if self._progress_origin is None or self._status() != "running":
            return None
        t0, f0 = self._progress_origin
        paused = self._paused_total_s + (time.monotonic() - self._paused_since if self._paused_since else 0.0)
        elapsed = time.monotonic() - t0 - paused
        if fraction <= f0 or elapsed <= 0:
            return None
        return int(time.time() + (1.0 - fraction) * elapsed / (fraction - f0))

    def job_status(self) -> dict[str, Any]:
        """The job as OpenAI's ``fine_tuning.job`` object, DeltaServe's own fields under ``deltaserve``."""
        status = self._status()
        progress = self.pool.progress()
        losses = self.stats.losses
        error = None
        if self._failed is not None:
            error = {"code": "backward_failed", "message": self._failed, "param": None}
        paused_by = ("operator" if self._operator_paused else "checkpoint_saves" if self.stats.paused_reason
                     else "nonfinite_steps" if self.stats.training_paused else None)
        job, lora = self.job, self.job.lora
        return {
            "object": "fine_tuning.job", "id": self.job_id, "model": self.spec.path, "training_file": job.dataset,
            "validation_file": None, "status": status, "created_at": self.created_at,
            "finished_at": self._cancelled_at if status == "cancelled" else
            self._finished_at if status == "succeeded" else None,
            "trained_tokens": self._trained_tokens(), "estimated_finish": self._estimated_finish(progress["fraction"]),
            "hyperparameters": {"n_epochs": job.epochs, "batch_size": job.backward_batch_tokens,
                                "learning_rate": job.lr, "weight_decay": job.weight_decay},
            "method": {"type": "supervised"}, "seed": job.seed,
            "fine_tuned_model": self.stats.published[-1] if self.stats.published else None,
            "result_files": [], "error": error,
            "deltaserve": {
                "adapter_name": job.adapter_name, "step": self.stats.adapter_step,
                "loss": losses[-1] if losses else None, "optimizer_steps_this_run": self.stats.optimizer_steps,
                "paused_by": paused_by, "paused_reason": self.stats.paused_reason or self.stats.training_paused,
                "cancel_requested": self._cancel_requested and status != "cancelled",
                "backward_busy": bool(self.backward is not None and self.backward.busy),
                "progress": {k: progress[k] for k in ("epoch", "epochs", "samples_completed", "samples_total",
                                                      "fraction")},
                "batch_size_unit": "tokens",
                "slo": {"ttft_s": job.slo.ttft_s, "tpot_s": job.slo.tpot_s, "avg_tpot_s": job.slo.avg_tpot_s},
                "slo_attainment": self.slo_monitor.attainment(),
                "lora": {"r": lora.r, "alpha": lora.lora_alpha, "target_modules": list(lora.target_modules),
                         "dropout": lora.lora_dropout},
                "publish": {"policy": job.publish.policy, "every_steps": job.publish.every_steps,
                            "keep": job.checkpoint.keep},
                "checkpoint": {"dir": job.checkpoint.dir, "every_steps": job.checkpoint.every_steps},
                "published": [self._published_log.get(n, {"name": n, "step": (parse_published_name(n) or (None, None))[1], "loss": None,
                                                          "created_at": None}) for n in self.stats.published],
            },
        }

    def job_checkpoints(self) -> list[dict[str, Any]]:
        """This run's checkpoints, oldest first, as OpenAI's ``fine_tuning.job.checkpoint`` objects (``metrics``:
        the loss of the step checkpointed, when this run trained it)."""
        return [{"object": "fine_tuning.job.checkpoint", "id": f"ftckpt-{self.job.adapter_name}-{c['step']}-{i}",
                 "fine_tuning_job_id": self.job_id, "created_at": c["created_at"], "step_number": c["step"],
                 "metrics": {"step": c["step"], "train_loss": c["loss"]},
                 "fine_tuned_model_checkpoint": c["path"]} for i, c in enumerate(self._checkpoint_log)]

    # ------------------------------------------------------------------------------------------ progress

    @property
    def finished(self) -> bool:
        bw = self.backward
        # pending host work (the last install or publish) keeps the job unfinished, so hosts keep offering the
        # idle step it runs in
        if self.stats.paused_reason is not None or self.stats.training_paused is not None:
            return not self._host_work  # nothing more will be trained: let idle hosts stop stepping
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
                 d["admitted_samples"], d["aborted_samples"], seen, mape, self._core_admission.safety,
                 self._core_admission.overhead_s * 1e3, self.pool.progress_line())
        if self.stats.save_failures or self.stats.paused_reason:
            # repeated in every progress line: a failing folder must not scroll out of sight after one error
            log.warning("fine-tuning: %d checkpoint saves failed (%d in a row)%s", self.stats.save_failures,
                        self.stats.consecutive_save_failures,
                        f"; PAUSED: {self.stats.paused_reason}" if self.stats.paused_reason else "")


# ---------------------------------------------------------------------------------------------- base model


def backward_base_model(host: HostHooks, path: str, dtype: torch.dtype, device: str) -> torch.nn.Module:
    """The base model the backward process trains through: built on the host's own weights when it lends them
    (:class:`~deltaserve_core.hooks.LendsBaseWeights`), else loaded from ``path``. Logs which, and the bytes."""
    from transformers import AutoModelForCausalLM

    lend = getattr(host, "base_weights", None)
    lent = lend() if lend is not None else None
    label = getattr(host, "name", type(host).__name__)
    if lent is None:
        model = AutoModelForCausalLM.from_pretrained(path, dtype=dtype).to(device).eval()
        log.info("backward base model: loaded from %s, %.1f MiB (host %r lends no weights)", path,
                 _param_bytes(model) / 2**20, label)
        return model
    model = model_on_lent_weights(path, lent, dtype=dtype, device=device, host=label)
    log.info("backward base model: mapped onto host %r's weights, %.1f MiB shared, 0 loaded", label,
             _param_bytes(model) / 2**20)
    return model


def model_on_lent_weights(path: str, lent: Mapping[str, torch.Tensor], *, dtype: torch.dtype, device: str,
                          host: str = "?") -> torch.nn.Module:
    """``AutoModelForCausalLM`` of ``path`` whose parameters *are* ``lent`` (no parameter memory of its own).

    Raises ``ValueError`` naming what breaks the :class:`~deltaserve_core.hooks.LendsBaseWeights` contract: a
    parameter without a tensor, a name the model does not have, a wrong dtype or device (shapes are checked by
    ``load_state_dict``)."""
    from accelerate import init_empty_weights
    from transformers import AutoConfig, AutoModelForCausalLM

    target = torch.device(device)
    wrong = [f"{n} ({t.dtype}, {t.device})" for n, t in lent.items()
             if t.dtype != dtype or t.device.type != target.type
             or (target.index is not None and t.device.index != target.index)]
    if wrong:
        raise ValueError(f"host {host!r} lends base weights that are not {dtype} on {device}: {', '.join(wrong[:5])}"
                         f"{' ...' if len(wrong) > 5 else ''}")
    # Parameters on the meta device until assigned; buffers real, because rotary inv_freq is computed at
    # construction and is in no checkpoint nor in what a host lends.
    with init_empty_weights(include_buffers=False):
        model = AutoModelForCausalLM.from_config(AutoConfig.from_pretrained(path), dtype=dtype)
    # detach(): new tensor objects on the same storage, so nothing the backward does to its parameters' flags
    # reaches the host's own parameter objects
    result = model.load_state_dict({n: t.detach() for n, t in lent.items()}, strict=False, assign=True)
    if result.unexpected_keys:
        raise ValueError(f"host {host!r} lends weights the model of {path} does not have: "
                         f"{', '.join(sorted(result.unexpected_keys)[:8])}")
    model.tie_weights()  # a tied output head (tie_word_embeddings) becomes the lent embedding, as in from_pretrained
    missing = [n for n, p in model.named_parameters(remove_duplicate=False) if p.is_meta]
    if missing:
        raise ValueError(f"host {host!r} lends no tensor for {len(missing)} parameter(s) of {path}: "
                         f"{', '.join(missing[:8])}{' ...' if len(missing) > 8 else ''}")
    return model.to(device).eval()  # moves the buffers; the lent parameters are already there


def _fmt_loss(loss: float | None) -> str:
    return f"{loss:.4f}" if loss is not None else "n/a"



def _timed(fn: Callable[[], object]) -> float:
    t0 = time.monotonic()
    fn()
    return time.monotonic() - t0


def _param_bytes(model: torch.nn.Module) -> int:
    return sum(p.numel() * p.element_size() for p in model.parameters())
