"""
h07 - on_arrival is announced for requests the host then refuses.

Rule (hooks.py, ScheduleInterceptor.on_arrival): "Tell the core a client request has entered the host. Called by:
the host ... once per client request. The core uses it to abort a running fine-tuning-only step so the new request
is not delayed by more than one layer."

Bug: the adapter wraps the engine's ``add_request`` and calls ``on_arrival`` on entry, before the engine validates
the request (unknown LoRA, reserved adapter name, prompt longer than the token budget). A refused request never
enters the host, yet the core was told it arrived (and aborts fine-tuning steps for it; its TTFT bookkeeping keeps
a request that will never be scheduled).

Trigger: any client request that the host refuses (a typo in an adapter name, an over-long prompt).
"""
from __future__ import annotations

import time

from deltaserve_core.testing.reference_host import ReferenceHost


class Host(ReferenceHost):
    def submit(self, request):
        if self._interceptor is not None:  # announced on entry of add_request
            self._interceptor.on_arrival(request.request_id, time.monotonic())
        interceptor, self._interceptor = self._interceptor, None
        try:
            super().submit(request)  # validates, queues (no second announcement)
        finally:
            self._interceptor = interceptor
