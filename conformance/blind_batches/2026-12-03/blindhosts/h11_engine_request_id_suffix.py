"""h11: the scheduler side names requests by the engine's internal id (client id plus a random suffix).

Rule (hooks.py, ScheduleInterceptor.on_arrival / types.py, ScheduledRequest.request_id): the core is told of each
client request by its id (``on_arrival(request_id, ...)``) and then sees it, by that id, in the
``ScheduledRequest`` of every step that runs or defers it ("one inference request as the host's scheduler sees
it"); the two must name the same request.

Bug: newer engines make request ids unique internally by appending a random suffix (vLLM: ``f"{id}-{uuid[:8]}"``);
the adapter announces arrivals with the client's id but fills ``ScheduledRequest.request_id`` from the engine's
request object, so no scheduled request matches any arrival.
Trigger: every client request.
"""
import dataclasses
import hashlib

from deltaserve_core.testing.reference_host import ReferenceHost


def _internal(rid: str) -> str:
    return f"{rid}-{hashlib.md5(rid.encode()).hexdigest()[:8]}"


class _Interceptor:
    def __init__(self, inner):
        self.inner = inner

    def on_schedule(self, batch):
        fix = lambda rs: tuple(dataclasses.replace(r, request_id=_internal(r.request_id)) for r in rs)  # noqa: E731
        return self.inner.on_schedule(dataclasses.replace(batch, scheduled=fix(batch.scheduled),
                                                          waiting=fix(batch.waiting)))

    def on_arrival(self, request_id, arrival_time):
        self.inner.on_arrival(request_id, arrival_time)


class Host(ReferenceHost):
    def intercept_schedule(self, interceptor) -> None:
        super().intercept_schedule(None if interceptor is None else _Interceptor(interceptor))
