"""h20: StepRecord.finetune_lengths come in the engine's length-sorted row order, the ids in injection order.

Rule (types.py, StepRecord): ``finetune_sample_ids`` "lists fine-tuning rows that completed the whole forward" and
``finetune_lengths`` their lengths, element for element (hooks.py, report_step_time: "the composition that
actually ran").

Bug: the engine sorts a step's prefill rows by length (longest first) for its kernels; the adapter takes the
lengths from the engine's sorted rows and the ids from its own plan, so with two or more fine-tuning rows the
lengths no longer belong to the ids beside them.
Trigger: a step carrying fine-tuning samples of different lengths, not already longest first.
"""
import dataclasses

from deltaserve_core.testing.reference_host import ReferenceHost


class Host(ReferenceHost):
    def _execute(self, step_id, rows, tokens, synthetic=False):
        sink, self._step_sink = self._step_sink, None
        try:
            record = super()._execute(step_id, rows, tokens, synthetic)
        finally:
            self._step_sink = sink
        record = dataclasses.replace(record, finetune_lengths=tuple(sorted(record.finetune_lengths, reverse=True)))
        if sink is not None:
            sink(record)
        return record
