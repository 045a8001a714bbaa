"""A co-serving job as the operator sees it: pause, resume and cancel, and the job's status and checkpoints as
OpenAI's ``fine_tuning.job`` objects (see :mod:`.job_control` for the calls that reach them).

:class:`JobStatusMixin` is part of :class:`~deltaserve_core.coserve.CoServer`; its state lives there. Its controls
are called on the thread that drives the host's steps (under ``vllm serve``: a ``collective_rpc`` between two
engine steps), so they never race ``on_schedule``; none of them blocks a step.
"""

from __future__ import annotations

import logging
import time
from typing import Any

from .hostkit import parse_published_name, publish_dir
from .job_config import JobConfig
from .job_control import EventLog, JobCallError, job_id

__all__ = ["JobStatusMixin", "job_object"]

log = logging.getLogger("deltaserve.coserve")


def job_object(job: JobConfig, model: str, status: str, created_at: int) -> dict[str, Any]:
    """``job`` as OpenAI's ``fine_tuning.job`` object before anything of it ran: what its settings say, nothing
    trained or published. A running job's status fills in the rest; a job still being prepared (a create over HTTP
    answered before its dataset loaded) shows this as it is."""
    lora = job.lora
    return {
        "object": "fine_tuning.job", "id": job_id(job.adapter_name), "model": model, "training_file": job.dataset,
        "validation_file": None, "status": status, "created_at": created_at, "finished_at": None,
        "trained_tokens": 0, "estimated_finish": None,
        "hyperparameters": {"n_epochs": job.epochs, "batch_size": job.backward_batch_tokens, "learning_rate": job.lr,
                            "weight_decay": job.weight_decay},
        "method": {"type": "supervised"}, "seed": job.seed, "fine_tuned_model": None, "result_files": [],
        "error": None,
        "deltaserve": {
            "adapter_name": job.adapter_name, "step": 0, "loss": None, "optimizer_steps_this_run": 0,
            "paused_by": None, "paused_reason": None, "cancel_requested": False, "backward_busy": False,
            # the dataset's size is known once it loaded
            "progress": {"epoch": 0, "epochs": job.epochs, "samples_completed": 0, "samples_total": None,
                         "fraction": 0.0},
            "batch_size_unit": "tokens",
            "slo": {"ttft_s": job.slo.ttft_s, "tpot_s": job.slo.tpot_s, "avg_tpot_s": job.slo.avg_tpot_s},
            "slo_attainment": {"requests": 0, "ttft": None, "tpot": None, "slo": None},
            "lora": {"r": lora.r, "alpha": lora.lora_alpha, "target_modules": list(lora.target_modules),
                     "dropout": lora.lora_dropout},
            "publish": {"policy": job.publish.policy, "every_steps": job.publish.every_steps,
                        "keep": job.checkpoint.keep, "dir": str(publish_dir(job))},
            "checkpoint": {"dir": job.checkpoint.dir, "every_steps": job.checkpoint.every_steps},
            "published": [],
        },
    }


class JobStatusMixin:
    """Operator controls and job status (see the module docs)."""

    def _init_operator_state(self) -> None:
        """The operator's controls (pause, resume, cancel) and what the jobs API reports (see job_control)."""
        self.job_id = job_id(self.job.adapter_name)
        self.events = EventLog()
        self.created_at = int(time.time())
        self._operator_paused = False
        self._paused_since: float | None = None
        self._paused_total_s = 0.0
        self._cancel_requested = False
        self._cancel_requested_at: int | None = None  # unix time of the operator's cancel (kept in checkpoints)
        self._cancel_cmd: int | None = None
        self._cancel_retry_at = 0.0
        self._cancelled_at: int | None = None
        self._finished_at: int | None = None
        self._failed: str | None = None
        self._progress_origin: tuple[float, float] | None = None  # (monotonic, fraction done) when training began
        self._checkpoint_log: list[dict[str, Any]] = []
        self._published_log: dict[str, dict[str, Any]] = {}
        self._step_losses: dict[int, float | None] = {}

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
        self._cancel_requested_at = int(time.time())
        self._admission_stopped = True
        log.info("fine-tuning cancelled by the operator: writing a final checkpoint")
        self.events.add("info", "cancellation requested: admission stopped, final checkpoint follows")
        self._advance_cancel()
        return self.job_status()

    def contain_failure(self, message: str) -> None:
        """Fail this job, and only it: admission stops for good and the status says ``failed`` with ``message``.
        Called by :mod:`.job_sharing` when the job's own code raised inside the host's step, where the exception
        would otherwise stop the engine and every other job on it."""
        if self._failed is None:
            self._failed = message
            self._admission_stopped = True
            log.error("fine-tuning job %s failed: %s", self.job_id, message)
            self.events.add("error", message)

    def _resume_cancelled(self, step: int, cancelled_at: int) -> None:
        """The checkpoint resumed from was written by or after a cancel (at unix time ``cancelled_at``): the job stays
        cancelled (no admission, its published versions still served), as the operator left it."""
        self._cancel_requested = True
        self._cancel_requested_at = self._cancelled_at = cancelled_at
        self._admission_stopped = True
        log.warning("fine-tuning job %s was cancelled before this start (checkpoint at step %d): it stays cancelled "
                    "and trains nothing; to train this adapter again, start a job with a new checkpoint.dir",
                    self.job_id, step)
        self.events.add("warn", f"cancelled before this start (checkpoint at step {step}); not resumed",
                        data={"step": step})

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
        out = job_object(self.job, self.spec.path, status, self.created_at)
        out.update(finished_at=self._cancelled_at if status == "cancelled" else
                   self._finished_at if status == "succeeded" else None,
                   trained_tokens=self._trained_tokens(), estimated_finish=self._estimated_finish(progress["fraction"]),
                   fine_tuned_model=self.stats.published[-1] if self.stats.published else None, error=error)
        out["deltaserve"].update(
            step=self.stats.adapter_step, loss=losses[-1] if losses else None,
            optimizer_steps_this_run=self.stats.optimizer_steps, paused_by=paused_by,
            paused_reason=self.stats.paused_reason or self.stats.training_paused,
            cancel_requested=self._cancel_requested and status != "cancelled",
            backward_busy=bool(self.backward is not None and self.backward.busy),
            progress={k: progress[k] for k in ("epoch", "epochs", "samples_completed", "samples_total", "fraction")},
            slo_attainment=self.slo_monitor.attainment(),
            published=[self._published_log.get(n, {"name": n, "step": (parse_published_name(n) or (None, None))[1],
                                                   "loss": None, "created_at": None}) for n in self.stats.published],
            **({"data_parallel": self._dp_status()} if getattr(self, "dp", None) is not None else {}))
        return out

    def job_checkpoints(self) -> list[dict[str, Any]]:
        """This run's checkpoints, oldest first, as OpenAI's ``fine_tuning.job.checkpoint`` objects (``metrics``:
        the loss of the step checkpointed, when this run trained it)."""
        return [{"object": "fine_tuning.job.checkpoint", "id": f"ftckpt-{self.job.adapter_name}-{c['step']}-{i}",
                 "fine_tuning_job_id": self.job_id, "created_at": c["created_at"], "step_number": c["step"],
                 "metrics": {"step": c["step"], "train_loss": c["loss"]},
                 "fine_tuned_model_checkpoint": c["path"]} for i, c in enumerate(self._checkpoint_log)]
