"""The controller's side of the backward process: sending captured samples to train, absorbing its reports
(optimizer steps, checkpoints, failures), pausing on repeated non-finite steps or failed saves, and restarting
it from its newest checkpoint when it dies or hangs.

:class:`TrainingMixin` is part of :class:`~deltaserve_core.coserve.CoServer`; its state lives there. Exactness
hinges on one ordering rule: every forward of the samples of backward batch *k* runs with the adapter after step
*k-1*, so a landed step queues the adapter install that admission waits for.
"""

from __future__ import annotations

import logging
import threading
import time
from typing import Any

from .backward_process import BackwardProcess, BackwardProcessError, BackwardReport
from .host_work import INSTALL, PUBLISH

__all__ = ["MAX_CONSECUTIVE_SAVE_FAILURES", "TrainingMixin"]

#: checkpoint saves in a row that may fail before fine-tuning pauses (inference is not affected)
MAX_CONSECUTIVE_SAVE_FAILURES = 3

log = logging.getLogger("deltaserve.coserve")


def _fmt_loss(loss: float | None) -> str:
    return f"{loss:.4f}" if loss is not None else "n/a"


class TrainingMixin:
    """Drive the backward process (see the module docs)."""

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
            if self.dp is not None:
                self._dp_step_landed(rep)  # parts sent after the step closed are still open
            else:
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
            self._defer(INSTALL, lambda: self.host.set_finetune_adapter(snapshot))
            ck = self.job.checkpoint
            if ck.every_steps and rep.step % ck.every_steps == 0:
                self._save(bw)
            pub = self.job.publish
            if pub.policy == "every_n_steps" and rep.step % pub.every_steps == 0:
                self._defer(PUBLISH, lambda: self._publish(rep.step))
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
                self._defer(PUBLISH, lambda: self._publish(rep.step))
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
        elif rep.kind == "stale" and self.dp is not None:
            self._dp_give_back(rep.sample_ids, free_slots=True)
        elif rep.kind == "died":
            self._recover(rep.message)

    def _save(self, bw: BackwardProcess) -> None:
        self._save_ids.add(bw.save_checkpoint(extra=self._checkpoint_extra()))

    def _checkpoint_extra(self) -> dict[str, Any]:
        from .preflight import resume_fields

        # the job's shape goes with the pool, so the next start can refuse an incompatible job before it starts
        extra: dict[str, Any] = {"pool": self.pool.state_dict(), "job": resume_fields(self.job)}
        if self.dp is not None:  # the global step the sample state is at (the backward may be ahead)
            extra["pool_seq"] = int((self._dp_last or {}).get("seq", -1))
        if self._cancel_requested_at is not None:
            # A cancel is final (as in OpenAI's API): every checkpoint from the cancel's on says so, and a restarted
            # server that resumes from one keeps the job cancelled instead of training on from the job file.
            extra["cancelled_at"] = self._cancel_requested_at
        return extra

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
                # a data-parallel rank replayed the steps decided since its checkpoint: it is where the others are
                at = bw.last_step if self.dp is not None else ck.step if ck else 0
                self._pending_reports.append(BackwardReport("recovered", step=at,
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
                if self.dp is not None:
                    self._dp_recovered(rep.step)  # nothing is redone: the replay put the adapter where the others are
                elif pool_state:
                    self.pool.load_state_dict(pool_state)
                else:
                    self.pool = self.dataset.make_pool()
                if self.dp is None:
                    self._admitted.clear()
                self._pending_ids, self._pending_tokens = [], 0
                self._step_ids, self._step_tokens = [], 0
                # an install queued before the fault belongs to a version the restart may have rewound past
                self._host_work.pop(INSTALL, None)
                self._host_work_since.pop(INSTALL, None)
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

    def _maybe_retry_save(self) -> None:
        """While paused for failed saves: try one save every ``save_retry_s`` (the adapter as it stands; nothing
        trains meanwhile). Its answer arrives through :meth:`_handle`, which resumes or re-arms the retry."""
        bw = self.backward
        if (self._save_retry_at is None or time.monotonic() < self._save_retry_at or self._save_ids
                or bw is None or bw.busy or self._recovering is not None or self._admission_stopped):
            return
        self._save_retry_at = time.monotonic() + self.save_retry_s  # re-armed by a failure's answer too
        self._save(bw)
