"""h32: submit() takes the engine's step lock, so a request arriving during a step waits for the step to end.

Rule (hooks.py, ScheduleInterceptor.on_arrival): "Called by: the host, from whichever thread accepts requests (it
may run while a step executes), once per client request. The core uses it to abort a running fine-tuning-only step
so the new request is not delayed by more than one layer. Must not block."; (driver.py, HostDriver.submit): "May be
called from another thread while ``step()`` runs (a server's request thread)".

Bug: the adapter protects its scheduler state with one coarse lock held for the whole engine step, scheduling and
forward alike, and ``submit`` takes the same lock before enqueueing and announcing the request. A request arriving
while a step runs blocks its request thread until the step has finished, and the core hears of it only then: a
fine-tuning-only step can no longer be aborted for it.

Trigger: ``submit`` from another thread while a step (for instance a fine-tuning-only step) executes.
"""
from __future__ import annotations

import threading

from deltaserve_core.testing.reference_host import ReferenceHost


class Host(ReferenceHost):
    def __init__(self, config) -> None:
        super().__init__(config)
        self._engine_lock = threading.Lock()

    def _step(self, allow_idle, report_executed=False):
        with self._engine_lock:
            return super()._step(allow_idle, report_executed)

    def submit(self, request):
        with self._engine_lock:
            super().submit(request)
