"""h16: output tokens are stamped with the time their step was scheduled, before the forward that made them.

Rule (types.py, ScheduledRequest): "``first_token_time`` is set once the request has produced its first token;
``last_token_time`` is the time of its most recent token"; driver.py ClientOutput: the times the client received
its tokens (``first_token_time``, ``token_times``).

Bug: the adapter timestamps each step's new tokens with the engine's iteration timestamp taken when the scheduler
starts the step (the stats timestamp), not when the tokens exist: every token time precedes the forward that
produced it, so TTFT and TPOT are understated by the scheduling and forward time of a step.
Trigger: every generated token.
"""
import time

from deltaserve_core.testing.reference_host import ReferenceHost


class Host(ReferenceHost):
    def _schedule(self):
        self._iteration_ts = time.monotonic()
        return super()._schedule()

    def _sample(self, rows, hidden) -> None:
        super()._sample(rows, hidden)
        ts = getattr(self, "_iteration_ts", None)
        if ts is None:
            return
        for r in rows:
            if r.sample is None and r.seq is not None and r.seq.token_times:
                r.seq.token_times[-1] = ts
