"""Broken host: on_arrival is announced by the scheduler loop between steps, not when the request is accepted.

Rule (src/deltaserve_core/hooks.py, ScheduleInterceptor.on_arrival): "Called by: the host, from whichever thread
accepts requests (it may run while a step executes), once per client request. The core uses it to abort a running
fine-tuning-only step so the new request is not delayed by more than one layer."

Bug: like an engine core that drains its input queue at the top of each scheduler iteration, the adapter queues
the arrival and calls on_arrival only when the next step starts; the request itself is queued (and its arrival
time stamped) at submit.
Trigger: a request submitted while a fine-tuning-only step runs: the core hears of it only after the step finished,
so the step is never aborted for it.
"""
import time

from deltaserve_core.driver import ClientRequest
from deltaserve_core.testing.reference_host import ReferenceHost, _Seq


class Host(ReferenceHost):
    name = "blind-h17"

    def _enqueue(self, request: ClientRequest) -> None:
        now = time.monotonic()
        with self._lock:
            self._waiting.append(_Seq(request, now))
            self.__dict__.setdefault("_inbox", []).append((request.request_id, now))  # BUG: announced later

    def _step(self, allow_idle, report_executed=False):
        with self._lock:
            inbox, self._inbox = self.__dict__.get("_inbox", []), []
        if self._interceptor is not None:
            for request_id, t in inbox:
                self._interceptor.on_arrival(request_id, t)
        return super()._step(allow_idle, report_executed)
