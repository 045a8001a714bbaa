"""Running totals of one co-serving job (:class:`CoServeStats`): what the controller logs, the jobs API and
the metrics endpoint report, and the benchmarks summarise."""

from __future__ import annotations

import time
from collections import Counter, deque
from dataclasses import dataclass, field
from typing import Any

__all__ = ["CoServeStats"]


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
