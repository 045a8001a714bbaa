"""
h21 - on a host without mixed batches, ProposedBatch.waiting leaves out the decodes the prefill step defers.

Rule (types.py, ProposedBatch): "``waiting`` are requests that arrived but are not in this step (queued prefills,
or on hosts without mixed batches the decodes this prefill step defers); they matter because their TTFT/TPOT
clocks keep running while this step executes."

Bug: the adapter (S-LoRA-style router, ``mixed_batches=False``) builds ``waiting`` from the router's pending
queue only; the running requests it holds back during a prefill step are not in its queue and are left out, so
the core never sees their TPOT clocks and admits fine-tuning tokens into that prefill step as if no decode waited.

Trigger: ``mixed_batches=False`` and a request arriving while others decode.
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
    pending = tuple(r for r in batch.waiting if r.prefill_tokens > 0)  # the router's pending queue only
    return dataclasses.replace(batch, waiting=pending)


class Host(ReferenceHost):
    def intercept_schedule(self, interceptor):
        super().intercept_schedule(None if interceptor is None else _Translated(interceptor, self))
