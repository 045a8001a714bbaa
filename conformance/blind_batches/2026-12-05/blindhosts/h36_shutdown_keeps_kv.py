"""h36: shutdown() stops the engine loop but leaves the scheduler's requests, and their KV cache, alive.

Rule (driver.py, HostDriver.shutdown): "Stop the engine and free its memory; idempotent."

Bug: the adapter's shutdown sets the engine's stop flag (later ``step()`` calls run nothing) but never tears down
the scheduler: the running and waiting requests stay referenced, and with them every KV tensor of the requests in
flight (a real engine's KV pool, here the per-request caches). The memory of an interrupted workload is held for the
life of the process.

Trigger: ``shutdown()`` while a request is unfinished (an interrupted run, a test that stops mid-generation).
"""
from __future__ import annotations

from deltaserve_core.testing.reference_host import ReferenceHost


class Host(ReferenceHost):
    _stopped = False

    def shutdown(self):
        self._stopped = True  # the engine loop exits; scheduler state left as is

    def _step(self, allow_idle, report_executed=False):
        if self._stopped:
            return False if report_executed else []
        return super()._step(allow_idle, report_executed)
