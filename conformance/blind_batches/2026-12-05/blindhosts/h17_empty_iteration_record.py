"""h17: an engine iteration that ran nothing still reports a step record.

Rule (hooks.py, HostHooks.report_step_time): "exactly one :class:`StepRecord` per executed step, in step order, with
the composition that actually ran"; (driver.py, HostDriver.run_idle_step): "True exactly when one ran (its
StepRecord reaches the step sink), False when the interceptor added nothing."

Bug: the adapter's post-step hook is installed on the engine's busy loop, which calls it after every iteration,
also when the scheduler output was empty (nothing scheduled, the interceptor added nothing): it then reports an
empty record (no rows, duration 0) under the step id drawn for that iteration.

Trigger: ``run_idle_step()`` when the interceptor has nothing to add (the core's usual answer between fine-tuning
batches), or ``step()`` on an idle host.
"""
from __future__ import annotations

import time

from deltaserve_core.testing.reference_host import ReferenceHost
from deltaserve_core.types import ExecutionMode, StepRecord


class _Ids:
    def __init__(self, inner):
        self.inner, self.last = inner, None

    def __iter__(self):
        return self

    def __next__(self):
        self.last = next(self.inner)
        return self.last


class Host(ReferenceHost):
    def __init__(self, config) -> None:
        super().__init__(config)
        self._step_ids = _Ids(self._step_ids)
        self._ran = False

    def _execute(self, step_id, rows, tokens, synthetic=False):
        self._ran = True
        return super()._execute(step_id, rows, tokens, synthetic)

    def _step(self, allow_idle, report_executed=False):
        self._ran = False
        drawn = self._step_ids.last
        result = super()._step(allow_idle, report_executed)
        if not self._ran and self._step_ids.last != drawn and self._step_sink is not None:
            now = time.monotonic()
            self._step_sink(StepRecord(step_id=self._step_ids.last, start_time=now, duration_s=0.0,
                                       mode=ExecutionMode.EAGER))
        return result
