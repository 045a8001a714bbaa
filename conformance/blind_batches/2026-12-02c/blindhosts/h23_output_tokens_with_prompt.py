"""
h23 - ScheduledRequest.output_tokens counts the prompt too.

Rule (types.py, ScheduledRequest): "``output_tokens`` counts tokens generated so far."

Bug: the adapter fills ``output_tokens`` from vLLM's ``request.num_tokens`` (prompt plus outputs) instead of
``num_output_tokens``: a request that has generated 2 tokens after a 10-token prompt reports 12, so the core's
average-TPOT budget (spent time over tokens generated) is diluted by the prompt length.

Trigger: every request with a prompt (all of them), visible from its first scheduled step.
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
        if r.prefill_tokens > 0:
            return dataclasses.replace(r, output_tokens=r.output_tokens + r.prefill_tokens)
        # a decode's context is prompt + outputs - 1 (its last token is computed now): num_tokens = context + 1
        return dataclasses.replace(r, output_tokens=r.context_tokens + 1)
    return dataclasses.replace(batch, scheduled=tuple(view(r) for r in batch.scheduled),
                               waiting=tuple(view(r) for r in batch.waiting))


class Host(ReferenceHost):
    def intercept_schedule(self, interceptor):
        super().intercept_schedule(None if interceptor is None else _Translated(interceptor, self))
