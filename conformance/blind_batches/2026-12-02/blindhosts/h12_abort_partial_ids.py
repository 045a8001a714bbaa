"""Abort bookkeeping breaks out of the loop after the first sample: only the first sample is reported aborted,
the others are reported completed (in end_step and in the StepRecord)."""
import dataclasses

from ._base import Patchable


class Host(Patchable):
    name = "blind-h12"

    def _end_step(self, sink, step_id, ft_ids, aborted):
        if aborted:
            sink.end_step(step_id, ft_ids[1:], ft_ids[:1])  # BUG
        else:
            sink.end_step(step_id, ft_ids, ())

    def _make_record(self, step_id, start, duration, rows, ft_rows, aborted, synthetic):
        rec = super()._make_record(step_id, start, duration, rows, ft_rows, aborted, synthetic)
        if aborted:
            ids = tuple(r.sample.sample_id for r in ft_rows)
            rec = dataclasses.replace(rec, aborted_sample_ids=ids[:1], finetune_sample_ids=ids[1:],
                                      finetune_lengths=tuple(r.length for r in ft_rows[1:]))
        return rec
