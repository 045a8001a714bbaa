"""h10: ScheduledRequest.last_token_time is the time of the last *streamed* token (stream interval 4).

Rule (types.py, ScheduledRequest): "``last_token_time`` is the time of its most recent token (for the TPOT budget)"

Bug: the adapter feeds its token clock from the engine's streamed outputs, which arrive for the first token and then
every ``stream_interval`` = 4 tokens (the adapter's default, to cut detokenizer work); between two chunks
``last_token_time`` stays at the last streamed token, up to 3 tokens old, so the core sees a longer gap than the
TPOT a client feels. first_token_time and the client's ClientOutput.token_times are right.

Trigger: every request of 3 or more tokens (its view lags from its third step on).
"""
from __future__ import annotations

from deltaserve_core.testing.reference_host import ReferenceHost, _Row  # noqa: F401
import time

from deltaserve_core.testing.reference_host import _Seq
from deltaserve_core.types import ScheduledRequest

STREAM_INTERVAL = 4


class _StreamedSeq(_Seq):
    def view(self, prefill: bool) -> ScheduledRequest:
        r = self.request
        return ScheduledRequest(
            request_id=r.request_id, arrival_time=self.arrival_time,
            prefill_tokens=len(r.prompt_ids) if prefill else 0, context_tokens=self.context,
            output_tokens=len(self.output), first_token_time=self.token_times[0] if self.token_times else None,
            # BUG: time of the last streamed token (tokens 1, 5, 9, ...), not of the most recent one
            last_token_time=self.token_times[((len(self.token_times) - 1) // STREAM_INTERVAL) * STREAM_INTERVAL]
            if self.token_times else None, slo=r.slo,
        )


class Host(ReferenceHost):
    def _enqueue(self, request: ClientRequest) -> None:
        """Queue an admitted request and tell the core it arrived (``submit`` after its checks)."""
        now = time.monotonic()
        with self._lock:
            self._waiting.append(_StreamedSeq(request, now))
        if self._interceptor is not None:
            self._interceptor.on_arrival(request.request_id, now)
