"""
h32 - an aborted fine-tuning-only step produces no step record.

Rule (hooks.py, HostHooks.report_step_time): "exactly one :class:`StepRecord` per executed step, in step order"
and ActivationSink.should_abort: on ``True`` the host "reports them in ``StepRecord.aborted_sample_ids``".

Bug: the adapter emits records from the output processor, which only runs for steps that produced something
(client tokens or completed fine-tuning rows). A fine-tuning-only step stopped by an abort has neither, so its
record is never sent: the core never learns the samples were aborted (they are neither completed nor returned to
the pool) and the step's time is missing from the timeline.

Trigger: any fine-tuning-only step whose should_abort answers True (a client arrives during an idle step).
"""
from __future__ import annotations

from deltaserve_core.testing.reference_host import ReferenceHost


class Host(ReferenceHost):
    def report_step_time(self, sink):
        if sink is None:
            return super().report_step_time(None)

        def emit(record):
            produced = record.prefill_lengths or record.num_decode or record.finetune_sample_ids
            if produced or record.synthetic:  # the output processor's "anything to report?" test
                sink(record)
        super().report_step_time(emit)
