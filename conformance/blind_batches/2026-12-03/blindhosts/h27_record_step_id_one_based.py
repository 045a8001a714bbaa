"""h27: StepRecord.step_id is one more than the id the step was proposed and captured under.

Rule (hooks.py, HostHooks.report_step_time / ScheduleInterceptor.on_schedule): the record reports "the composition
that actually ran" for the step the interceptor was offered (``ProposedBatch.step_id``) and whose captures the
sink received (``begin_step(step_id, ...)``): one step, one id, on all three.

Bug: the engine's output processor counts the steps it has processed starting at 1; the adapter stamps records
with that counter while ProposedBatch and the activation sink use the scheduler's 0-based step id, so every record
names the following step (admissions and captures are then attributed to the wrong step).
Trigger: every step.
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
        self._processed = getattr(self, "_processed", 0) + 1
        record = dataclasses.replace(record, step_id=self._processed)
        if sink is not None:
            sink(record)
        return record
