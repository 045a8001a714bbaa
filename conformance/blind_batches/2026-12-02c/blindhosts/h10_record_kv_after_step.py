"""
h10 - StepRecord.kv_tokens counts each decode's KV after the step (one token too many per decode).

Rule (hooks.py, HostHooks.report_step_time): "exactly one :class:`StepRecord` per executed step, in step order,
with the composition that actually ran" and types.py ProposedBatch.kv_tokens: "Total KV-cache tokens read by the
step's decode requests (the K of Equations I/II)" (the record's ``kv_tokens`` is the same quantity for the step
that ran).

Bug: the output processor builds the record after the step from the requests' ``seq_lens`` (which already include
the token just written), so ``kv_tokens`` is ``sum(context + 1)`` over the decodes: the latency model is fitted
against a K that is larger by the decode batch size than the K the step read (and than the batch's own kv_tokens).

Trigger: every step with decode rows.
"""
from __future__ import annotations

import dataclasses

from deltaserve_core.testing.reference_host import ReferenceHost


class Host(ReferenceHost):
    def report_step_time(self, sink):
        if sink is None:
            return super().report_step_time(None)

        def emit(record):  # seq_lens read after the step wrote the new token
            sink(dataclasses.replace(record, kv_tokens=record.kv_tokens + record.num_decode))
        super().report_step_time(emit)
