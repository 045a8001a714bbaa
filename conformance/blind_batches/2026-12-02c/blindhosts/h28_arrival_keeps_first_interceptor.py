"""
h28 - on_arrival keeps going to the first interceptor after intercept_schedule installed another.

Rule (hooks.py, HostHooks.intercept_schedule): "It calls ``interceptor.on_arrival`` for each client request. ... A
later call replaces the installed interceptor, which is never called again."

Bug: the request-accepting thread (the API server side of the adapter) is started at the first
``intercept_schedule`` with the interceptor bound in its closure; later calls update the scheduler's slot (so
on_schedule goes to the new interceptor) but not the thread's copy. ``None`` is honoured (the thread checks the
slot for None first).

Trigger: a second ``intercept_schedule(new)`` during the host's life (a core restarted on the same engine, a job
replaced).
"""
from __future__ import annotations

import time

from deltaserve_core.testing.reference_host import ReferenceHost


class Host(ReferenceHost):
    _arrival_target = None

    def intercept_schedule(self, interceptor):
        super().intercept_schedule(interceptor)
        if self._arrival_target is None:
            self._arrival_target = interceptor  # bound once, when the accepting thread starts

    def _enqueue(self, request):
        now = time.monotonic()
        with self._lock:
            from deltaserve_core.testing.reference_host import _Seq

            self._waiting.append(_Seq(request, now))
        if self._interceptor is not None and self._arrival_target is not None:
            self._arrival_target.on_arrival(request.request_id, now)
