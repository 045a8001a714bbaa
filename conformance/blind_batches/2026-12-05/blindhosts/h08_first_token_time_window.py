"""h08: first_token_time read from a sliding window of recent token times.

Rule (types.py, ScheduledRequest): "``first_token_time`` never changes once set and is never later than
``last_token_time`` (the core measures TTFT from one and TPOT from the other)."

Bug: the scheduler-side request stats keep a bounded window of the last 16 token times (enough for the TPOT
budget, and memory stays bounded for long generations); the adapter reads ``first_token_time`` as the window's
oldest entry, so after 16 tokens it moves forward with every step.

Trigger: any request that generates more than 16 tokens.
"""
from __future__ import annotations

import time

from deltaserve_core.testing.reference_host import ReferenceHost, _Seq
from deltaserve_core.types import ScheduledRequest

_WINDOW = 16


class _WindowedSeq(_Seq):
    def view(self, prefill):
        r = self.request
        recent = self.token_times[-_WINDOW:]
        return ScheduledRequest(
            request_id=r.request_id, arrival_time=self.arrival_time,
            prefill_tokens=len(r.prompt_ids) if prefill else 0, context_tokens=self.context,
            output_tokens=len(self.output), first_token_time=recent[0] if recent else None,
            last_token_time=recent[-1] if recent else None, slo=r.slo,
        )


class Host(ReferenceHost):
    def _enqueue(self, request):
        now = time.monotonic()
        with self._lock:
            self._waiting.append(_WindowedSeq(request, now))
        if self._interceptor is not None:
            self._interceptor.on_arrival(request.request_id, now)
