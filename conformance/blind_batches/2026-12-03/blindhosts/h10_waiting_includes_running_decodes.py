"""h10: ProposedBatch.waiting also lists the decodes that run in this very step.

Rule (types.py, ProposedBatch): "``scheduled`` are the requests that run in this step. ``waiting`` are requests
that arrived but are not in this step (queued prefills, or on hosts without mixed batches the decodes this prefill
step defers)".

Bug: the adapter builds ``waiting`` from the engine's queues as "waiting queue + running list minus the new
prefills", and the running list still holds the decodes scheduled in this step: every decode of the step appears
both in ``scheduled`` and in ``waiting`` (the core then prices their TPOT clocks as if the step delayed them).
Trigger: every step with a decode in it.
"""
import dataclasses

from deltaserve_core.testing.reference_host import ReferenceHost


class _Interceptor:
    def __init__(self, inner):
        self.inner = inner

    def on_schedule(self, batch):
        ids = {r.request_id for r in batch.waiting}
        running = tuple(r for r in batch.scheduled if r.is_decode and r.request_id not in ids)
        return self.inner.on_schedule(dataclasses.replace(batch, waiting=batch.waiting + running))

    def on_arrival(self, request_id, arrival_time):
        self.inner.on_arrival(request_id, arrival_time)


class Host(ReferenceHost):
    def intercept_schedule(self, interceptor) -> None:
        super().intercept_schedule(None if interceptor is None else _Interceptor(interceptor))
