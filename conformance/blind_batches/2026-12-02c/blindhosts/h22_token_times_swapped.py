"""
h22 - ScheduledRequest.first_token_time and last_token_time are swapped.

Rule (types.py, ScheduledRequest): "``first_token_time`` is set once the request has produced its first token;
``last_token_time`` is the time of its most recent token (for the TPOT budget)".

Bug: the adapter unpacks its token clock's ``(first, last)`` pair as ``last, first = clock.times(id)``. With one
token both are equal; from the second token on, the TPOT budget is measured from the first token (it looks
overdue) and the TTFT from the latest one.

Trigger: any request that has produced two or more tokens (every decode after the first).
"""
from __future__ import annotations

import dataclasses

from deltaserve_core.testing.reference_host import ReferenceHost
from deltaserve_core.types import ProposedBatch, ScheduledRequest  # noqa: F401


class _Translated:
    """The interceptor as the scheduler subclass calls it, with the batch translated from the engine's output."""

    def __init__(self, interceptor, host):
        self._ic = interceptor
        self._host = host

    def on_schedule(self, batch):
        return self._ic.on_schedule(_translate(batch))

    def on_arrival(self, request_id, arrival_time):
        self._ic.on_arrival(request_id, arrival_time)


def _translate(batch: ProposedBatch) -> ProposedBatch:
    def view(r: ScheduledRequest) -> ScheduledRequest:
        last, first = r.first_token_time, r.last_token_time  # unpacked in the wrong order
        return dataclasses.replace(r, first_token_time=first, last_token_time=last)
    return dataclasses.replace(batch, scheduled=tuple(view(r) for r in batch.scheduled),
                               waiting=tuple(view(r) for r in batch.waiting))


class Host(ReferenceHost):
    def intercept_schedule(self, interceptor):
        super().intercept_schedule(None if interceptor is None else _Translated(interceptor, self))
