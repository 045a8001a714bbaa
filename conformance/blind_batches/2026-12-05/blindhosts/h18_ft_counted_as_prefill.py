"""h18: fine-tuning rows are counted among the step's prefills in its record.

Rule (hooks.py, HostHooks.report_step_time): "exactly one :class:`StepRecord` per executed step, in step order,
with the composition that actually ran"; (types.py, StepRecord): ``prefill_lengths`` / ``finetune_lengths`` keep
client prefills and fine-tuning rows apart (``finetune_tokens``, ``has_prefill``).

Bug: the adapter fills ``prefill_lengths`` from the engine's per-request scheduled token counts (vLLM's
``num_scheduled_tokens``), in which the injected fine-tuning requests are ordinary prefills, and fills
``finetune_lengths`` from its own plan: every fine-tuning row is reported twice, once as a client prefill.

Trigger: any step that carries fine-tuning rows (mixed or fine-tuning-only).
"""
from __future__ import annotations

from dataclasses import replace

from deltaserve_core.testing.reference_host import ReferenceHost


class Host(ReferenceHost):
    def report_step_time(self, sink):
        if sink is None:
            super().report_step_time(None)
            return

        def engine_counts(record):
            sink(replace(record, prefill_lengths=record.prefill_lengths + record.finetune_lengths))
        super().report_step_time(engine_counts)
