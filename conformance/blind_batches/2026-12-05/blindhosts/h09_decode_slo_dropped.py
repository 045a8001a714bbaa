"""h09: the request's SLO reaches the core only while it prefills; decode views carry none.

Rule (types.py, ScheduledRequest): "``slo`` must be the client request's own ``ClientRequest.slo``, exactly as
submitted (``None`` only when the client gave none): the core budgets each request against it."

Bug: the adapter builds prefill views from the new-request data (which holds the sampling and SLO parameters) and
decode views from the engine's cached per-request state (vLLM's ``CachedRequestData``), which does not carry them:
every decoding request is offered with ``slo=None``, also in ``waiting`` (deferred decodes).

Trigger: any request with an SLO that decodes (max_tokens >= 2).
"""
from __future__ import annotations

import time

from deltaserve_core.testing.reference_host import ReferenceHost, _Seq
from deltaserve_core.types import ScheduledRequest


class _CachedSeq(_Seq):
    def view(self, prefill):
        r = self.request
        return ScheduledRequest(
            request_id=r.request_id, arrival_time=self.arrival_time,
            prefill_tokens=len(r.prompt_ids) if prefill else 0, context_tokens=self.context,
            output_tokens=len(self.output), first_token_time=self.token_times[0] if self.token_times else None,
            last_token_time=self.token_times[-1] if self.token_times else None, slo=r.slo if prefill else None,
        )


class Host(ReferenceHost):
    def _enqueue(self, request):
        now = time.monotonic()
        with self._lock:
            self._waiting.append(_CachedSeq(request, now))
        if self._interceptor is not None:
            self._interceptor.on_arrival(request.request_id, now)
