"""
h35 - StepRecord.start_time is stamped when the record is built, after the forward finished.

Rule (types.py, StepRecord): ``start_time`` / ``duration_s``: "``duration_s`` is the device-complete wall time of
the forward step"; the step occupies ``[start_time, start_time + duration_s]`` in the scheduling process's
``time.monotonic()`` ("Time is always ``time.monotonic()`` seconds of the process that schedules").

Bug: the adapter builds the record in the output processor with ``start_time=time.monotonic()`` (hostkit's
``StepPlan.to_record`` default when ``plan.start`` was never set) and the measured duration: every step appears to
start when it actually ended, so the timeline is shifted by one step duration (a step "starts" after the tokens
it produced).

Trigger: every step.
"""
from __future__ import annotations

import dataclasses
import time

from deltaserve_core.testing.reference_host import ReferenceHost


class Host(ReferenceHost):
    def report_step_time(self, sink):
        if sink is None:
            return super().report_step_time(None)

        def emit(record):  # StepPlan.start never set: to_record() stamps "now"
            sink(dataclasses.replace(record, start_time=time.monotonic()))
        super().report_step_time(emit)
