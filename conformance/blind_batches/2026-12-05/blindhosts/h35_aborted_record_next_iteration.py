"""h35: the record of an aborted fine-tuning-only step is delivered after the next step's record.

Rule (hooks.py, HostHooks.report_step_time): "exactly one :class:`StepRecord` per executed step, in step order, with
the composition that actually ran and its device-complete duration. Called by the host in the scheduling process
after the step's outputs are processed, never before".

Bug: an aborted forward returns no model output, so the adapter's output processor (which emits records as it
processes each step's outputs) picks the aborted step up only on its next iteration, after it processed, and
reported, the step that followed: the aborted step's record arrives late and out of step order (and never, if no
step follows).

Trigger: a fine-tuning-only step aborted by the core (a client request arriving during it), then any step.
"""
from __future__ import annotations

from deltaserve_core.testing.reference_host import ReferenceHost


class Host(ReferenceHost):
    def report_step_time(self, sink):
        if sink is None:
            super().report_step_time(None)
            return
        held = []

        def output_processor(record):
            if record.aborted_sample_ids and not (record.finetune_sample_ids or record.prefill_lengths
                                                  or record.num_decode):
                held.append(record)  # no outputs to process yet: picked up next iteration
                return
            sink(record)
            while held:
                sink(held.pop(0))
        super().report_step_time(output_processor)
