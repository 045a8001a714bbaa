"""
h09 - ScheduledRequest.context_tokens of a decode counts the token being decoded in this step.

Rule (types.py, ScheduledRequest): "``context_tokens`` is the KV-cache length the request attends over *before*
this step."

Bug: the adapter fills ``context_tokens`` from vLLM's ``request.num_tokens`` (prompt + outputs, which includes the
last sampled token whose KV this very step computes) instead of ``num_computed_tokens``: every decode is one token
long, so ``ProposedBatch.kv_tokens`` overstates K by the decode batch size (and disagrees with the step record).

Trigger: every step with decode rows.
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
        if r.prefill_tokens == 0:  # num_tokens, not num_computed_tokens
            return dataclasses.replace(r, context_tokens=r.context_tokens + 1)
        return r
    return dataclasses.replace(batch, scheduled=tuple(view(r) for r in batch.scheduled))


class Host(ReferenceHost):
    def intercept_schedule(self, interceptor):
        super().intercept_schedule(None if interceptor is None else _Translated(interceptor, self))
