"""
h12 - the step's clock starts when the scheduler is entered, so duration_s includes scheduling and admission.

Rule (types.py, StepRecord): "``duration_s`` is the device-complete wall time of the forward step" and hooks.py
report_step_time: "with the composition that actually ran and its device-complete duration".

Bug: the scheduler subclass stamps the step start when ``schedule()`` is entered and the record's duration runs
from there, so it also contains batch formation and the core's own ``on_schedule`` decision (and any host-side
work between them). ``start_time`` moves back accordingly.

Trigger: every step; the error is as large as the time spent in scheduling and ``on_schedule``.
"""
from __future__ import annotations

import dataclasses
import time

from deltaserve_core.testing.reference_host import ReferenceHost


class Host(ReferenceHost):
    _sched_start = None

    def _step(self, allow_idle, report_executed=False):
        self._sched_start = time.monotonic()  # schedule() entered
        try:
            return super()._step(allow_idle, report_executed)
        finally:
            self._sched_start = None

    def report_step_time(self, sink):
        if sink is None:
            return super().report_step_time(None)

        def emit(record):
            t0 = self._sched_start
            if t0 is not None and not record.synthetic:
                end = record.start_time + record.duration_s
                record = dataclasses.replace(record, start_time=t0, duration_s=end - t0)
            sink(record)
        super().report_step_time(emit)
