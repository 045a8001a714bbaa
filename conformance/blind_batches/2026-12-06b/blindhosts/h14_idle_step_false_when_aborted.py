"""h14: run_idle_step() answers False for a fine-tuning-only step that ran and was aborted.

Rule (driver.py, HostDriver.run_idle_step): "Returns whether a step executed: True exactly when one ran (its
StepRecord reaches the step sink), False when the interceptor added nothing."

Bug: the adapter answers "did the fine-tuning step do its work", i.e. whether the step's record completed any sample
(``bool(record.finetune_sample_ids)``). An aborted step ran (its record, with the samples in
``aborted_sample_ids``, reaches the step sink) but run_idle_step returns False.

Trigger: a fine-tuning-only idle step aborted at a layer boundary: what the core does whenever a client request
arrives during one (on_arrival -> should_abort True), the whole point of abort support.
"""
from __future__ import annotations

from deltaserve_core.testing.reference_host import ReferenceHost, _Row  # noqa: F401
from deltaserve_core.types import StepRecord


class Host(ReferenceHost):
    def _execute(self, step_id, rows, tokens, synthetic=False) -> StepRecord:
        record = super()._execute(step_id, rows, tokens, synthetic)
        self._last_record = record
        return record

    def run_idle_step(self) -> bool:
        if self.has_unfinished():
            return False
        self._last_record = None
        ran = bool(self._step(allow_idle=True, report_executed=True))
        # BUG: 'executed' read as 'completed samples': an aborted step counts as not run
        return ran and self._last_record is not None and bool(self._last_record.finetune_sample_ids)
