"""h26: each step's record reaches the step sink only when the next step runs (the last one waits indefinitely).

Rule (hooks.py, HostHooks.report_step_time): "exactly one :class:`StepRecord` per executed step, in step order ...
Called by the host in the scheduling process after the step's outputs are processed."

Bug: with asynchronous scheduling the adapter processes step N's outputs while step N+1 is being scheduled and
emits step N's record from the *next* iteration's bookkeeping; when the engine goes idle after a burst, the last
step's record is not delivered (its outputs were already returned to the client), and it only arrives, late,
after the next step executes.
Trigger: the last step of every burst of work (e.g. every generate() call).
"""
from deltaserve_core.testing.reference_host import ReferenceHost


class Host(ReferenceHost):
    def _execute(self, step_id, rows, tokens, synthetic=False):
        sink, self._step_sink = self._step_sink, None
        try:
            record = super()._execute(step_id, rows, tokens, synthetic)
        finally:
            self._step_sink = sink
        pending, self._pending_record = getattr(self, "_pending_record", None), record
        if sink is not None and pending is not None:
            sink(pending)
        return record
