"""
h11 - StepRecord.finetune_lengths reports each sample's trained (target) tokens, not the tokens it ran.

Rule (hooks.py, HostHooks.report_step_time): "exactly one :class:`StepRecord` per executed step ... with the
composition that actually ran"; types.py StepRecord ``finetune_lengths`` (with ``finetune_tokens`` their sum) are
the fine-tuning rows' lengths, the tokens the step computed for them.

Bug: the adapter fills ``finetune_lengths`` from ``sample.num_targets`` (the loss-bearing tokens, which its
dataloader logs) instead of ``sample.num_tokens``. For a sample whose prompt is masked out the record understates
the rows by the prompt length; calibration then under-prices fine-tuning tokens.

Trigger: every step with fine-tuning rows (the first token of a sample is never a target, so even a fully trained
sample is off by one).
"""
from __future__ import annotations

import dataclasses

from deltaserve_core.testing.reference_host import ReferenceHost


class _Remember:
    def __init__(self, interceptor, host):
        self._ic, self._host = interceptor, host

    def on_schedule(self, batch):
        samples = list(self._ic.on_schedule(batch))
        for s in samples:
            self._host._ft_samples[s.sample_id] = s
        return samples

    def on_arrival(self, request_id, arrival_time):
        self._ic.on_arrival(request_id, arrival_time)


class Host(ReferenceHost):
    def __init__(self, config):
        super().__init__(config)
        self._ft_samples = {}

    def intercept_schedule(self, interceptor):
        super().intercept_schedule(None if interceptor is None else _Remember(interceptor, self))

    def report_step_time(self, sink):
        if sink is None:
            return super().report_step_time(None)

        def emit(record):
            if record.finetune_sample_ids and not record.synthetic:
                lengths = tuple(self._ft_samples.pop(i).num_targets if i in self._ft_samples else n
                                for i, n in zip(record.finetune_sample_ids, record.finetune_lengths))
                record = dataclasses.replace(record, finetune_lengths=lengths)
            sink(record)
        super().report_step_time(emit)
