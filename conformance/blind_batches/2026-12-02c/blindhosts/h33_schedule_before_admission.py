"""
h33 - on_schedule is offered the running batch before the scheduler admitted this step's new prefills.

Rule (hooks.py, ScheduleInterceptor.on_schedule): "Called by: the host's scheduler ... exactly once per step,
after the host has chosen its inference batch and before it dispatches it" and HostHooks.intercept_schedule: "the
host calls ``interceptor.on_schedule(batch)`` once per step before dispatch with the batch it will run".

Bug: the scheduler subclass calls the interceptor at the top of ``schedule()``, after the running queue was
budgeted but before waiting requests are admitted: the batch it offers lists only the decodes (the new prefills
still show as waiting), while the step that runs also carries those prefills. The core prices fine-tuning rows
against a decode-only step and injects them next to a prefill.

Trigger: any step that admits a new request (every request's first step).
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
    running = tuple(r for r in batch.scheduled if r.prefill_tokens == 0)
    admitted = tuple(r for r in batch.scheduled if r.prefill_tokens > 0)  # not admitted yet at that point
    return dataclasses.replace(batch, scheduled=running, waiting=admitted + batch.waiting)


class Host(ReferenceHost):
    def intercept_schedule(self, interceptor):
        super().intercept_schedule(None if interceptor is None else _Translated(interceptor, self))
