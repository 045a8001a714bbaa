"""Host calls that cost engine time between two steps (installing a new adapter version, publishing one), run
when a step can absorb them.

An install or publish runs on the engine's thread between two steps, so every decode in flight waits for it.
:class:`HostWorkMixin` (part of :class:`~deltaserve_core.coserve.CoServer`; its state lives there) queues them,
newest per kind, and runs each in a step whose spare time, priced by admission, covers its measured cost; the wait
is bounded by ``host_work_deadline_s``.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable

from .types import ProposedBatch

__all__ = ["INSTALL", "PUBLISH", "HostWorkMixin", "timed"]

INSTALL, PUBLISH = "install", "publish"

log = logging.getLogger("deltaserve.coserve")


def timed(fn: Callable[[], object]) -> float:
    """Seconds ``fn()`` took."""
    t0 = time.monotonic()
    fn()
    return time.monotonic() - t0


class HostWorkMixin:
    """Deferred host work (see the module docs)."""

    def flush_host_work(self) -> None:
        """Run the deferred adapter install and publish now (callers that know no request waits: shutdown, tests)."""
        for key in (INSTALL, PUBLISH):
            if key in self._host_work:
                self._run_one(key)

    def _run_one(self, key: str) -> float:
        work = self._host_work.pop(key)
        waited = time.monotonic() - self._host_work_since.pop(key)
        self.stats.host_work_max_wait_s = max(self.stats.host_work_max_wait_s, waited)
        took = timed(work)
        self._host_work_s[key].append(took)
        self.stats.host_work_runs[key] += 1
        return took

    def _defer(self, key: str, work: Callable[[], None]) -> None:
        """Queue host work; a newer call of the same kind replaces the older one but keeps its waiting time."""
        self._host_work[key] = work
        self._host_work_since.setdefault(key, time.monotonic())

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
        for key in (INSTALL, PUBLISH):
            if key in self._host_work and self._fits(key, batch, now, used):
                used += self._run_one(key)
        return INSTALL not in self._host_work, used

    def _fits(self, key: str, batch: ProposedBatch, now: float, used: float) -> bool:
        if batch.is_empty:
            return True
        waited = now - self._host_work_since[key]
        if waited >= 2 * self.host_work_deadline_s:
            self.stats.host_work_forced += 1
            log.warning("%s waited %.1f s for a step with room for it; running it now (host_work_deadline_s=%.1f)",
                        key, waited, self.host_work_deadline_s)
            return True
        cost = max(self._host_work_s[key] or self._host_work_s[INSTALL], default=0.0)
        # the step is priced with the inference-only margin (it carries no fine-tuning rows); past the deadline
        # with the plain prediction
        inference_margin = waited < self.host_work_deadline_s
        return self.admission.spare_s(batch, inference_margin=inference_margin) - used >= cost
