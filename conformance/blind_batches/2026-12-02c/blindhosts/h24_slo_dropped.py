"""
h24 - the request's SLO never reaches the ScheduledRequest.

Rule (types.py, ScheduledRequest / RequestSLO): ``slo`` carries the "Latency objectives of one inference request
(seconds). ``None`` means "use the job default"." -- a host reports the request's own objectives.

Bug: the adapter passes the client id through ``SamplingParams.extra_args`` but forgets the SLO (or reads it back
under the wrong key), so every ScheduledRequest has ``slo=None``: requests with a tight per-request TTFT/TPOT are
scheduled against the job default and fine-tuning rows are admitted into steps that miss their objective.

Trigger: any client request with a per-request ``slo``.
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
        return dataclasses.replace(r, slo=None)  # extra_args["deltaserve"]["slo"] never set
    return dataclasses.replace(batch, scheduled=tuple(view(r) for r in batch.scheduled),
                               waiting=tuple(view(r) for r in batch.waiting))


class Host(ReferenceHost):
    def intercept_schedule(self, interceptor):
        super().intercept_schedule(None if interceptor is None else _Translated(interceptor, self))
