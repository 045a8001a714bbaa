"""h09: request arrival times are the engine's wall-clock timestamps, not time.monotonic().

Rule (types.py, module docstring): "Time is always ``time.monotonic()`` seconds of the process that schedules";
ScheduleInterceptor.on_arrival(request_id, arrival_time) and ScheduledRequest.arrival_time carry that clock (and
driver.py ClientOutput: "Times are ``time.monotonic()`` of the driving process").

Bug: the adapter forwards the engine's own request timestamp, which is ``time.time()`` (vLLM's
``Request.arrival_time`` is wall-clock), without converting it: arrival times are ~1.7e9 s off the monotonic
clock every other time is on, so TTFT budgets are nonsense.
Trigger: every client request.
"""
import time

from deltaserve_core.testing.reference_host import ReferenceHost, _Seq


class Host(ReferenceHost):
    def _enqueue(self, request) -> None:
        now = time.time()  # the engine's request timestamp
        with self._lock:
            self._waiting.append(_Seq(request, now))
        if self._interceptor is not None:
            self._interceptor.on_arrival(request.request_id, now)
