"""
h27 - a calibration step's record reaches the step sink twice.

Rule (hooks.py, HostHooks.report_step_time): "exactly one :class:`StepRecord` per executed step, in step order";
run_profile_step: "The record is also delivered to the step sink with ``synthetic=True``."

Bug: the profile path delivers the record itself ("also delivered to the step sink") although the step went
through the normal output path, which already reported it: each synthetic step is counted twice by the core (two
calibration samples of one measurement, two timeline entries with one step id).

Trigger: every run_profile_step while a step sink is installed.
"""
from __future__ import annotations

from deltaserve_core.testing.reference_host import ReferenceHost


class Host(ReferenceHost):
    def run_profile_step(self, shape):
        record = super().run_profile_step(shape)  # the normal path reported it already
        if self._step_sink is not None:
            self._step_sink(record)  # "also delivered to the step sink"
        return record
