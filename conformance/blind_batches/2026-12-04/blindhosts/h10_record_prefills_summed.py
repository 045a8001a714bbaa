"""Broken host: StepRecord.prefill_lengths reports the step's prefill tokens as one summed entry.

Rule (src/deltaserve_core/hooks.py, HostHooks.report_step_time): "exactly one StepRecord per executed step, in step
order, with the composition that actually ran"; StepRecord.prefill_lengths mirrors ProposedBatch.prefill_lengths
(types.py): one entry per prefilling request.

Bug: the engine's scheduler output gives the number of prefill tokens of the varlen batch as one total
(``num_prefill_tokens``) and the adapter reports that as ``(total,)``.
Trigger: two or more prompts prefilled in one step (any burst of requests).
"""
import dataclasses

from deltaserve_core.testing.reference_host import ReferenceHost
from deltaserve_core.types import StepRecord


class Host(ReferenceHost):
    name = "blind-h10"

    def _execute(self, step_id, rows, tokens, synthetic=False) -> StepRecord:
        sink, held = self._step_sink, []
        self._step_sink = held.append
        try:
            record = super()._execute(step_id, rows, tokens, synthetic)
        finally:
            self._step_sink = sink
        total = sum(record.prefill_lengths)
        record = dataclasses.replace(record, prefill_lengths=(total,) if total else ())  # BUG: one summed entry
        if sink is not None:
            sink(record)
        return record
