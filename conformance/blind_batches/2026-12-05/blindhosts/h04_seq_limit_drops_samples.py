"""h04: samples over the engine's sequence limit are dropped silently, neither run nor refused.

Rule (hooks.py, HostHooks.intercept_schedule): "Samples the step cannot take are refused in that step's record
(``aborted_sample_ids``), never carried to a later step."

Bug: every fine-tuning row is one engine sequence, and the engine caps a step at ``max_running_requests``
sequences (vLLM's ``max_num_seqs``). The adapter adds the samples one by one and ignores the engine's refusal of
those over the cap: they are neither in ``finetune_sample_ids`` nor in ``aborted_sample_ids`` of the record, so the
core never gets them back into its pool.

Trigger: a step whose client rows plus returned samples exceed ``max_running_requests`` (32 by default): e.g. 31
requests prefilled together and two or more samples admitted beside them.
"""
from __future__ import annotations

from deltaserve_core.testing.reference_host import ReferenceHost


class _SeqCapped:
    def __init__(self, inner, host):
        self.inner, self.host = inner, host

    def on_schedule(self, batch):
        samples = list(self.inner.on_schedule(batch))
        free = max(0, self.host.config.max_running_requests - len(batch.scheduled))
        return samples[:free]  # add_request() returned False for the rest: ignored

    def on_arrival(self, request_id, arrival_time):
        self.inner.on_arrival(request_id, arrival_time)


class Host(ReferenceHost):
    def intercept_schedule(self, interceptor):
        super().intercept_schedule(None if interceptor is None else _SeqCapped(interceptor, self))
