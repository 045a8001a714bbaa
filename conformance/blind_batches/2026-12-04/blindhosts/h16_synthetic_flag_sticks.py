"""Broken host: after calibration every served step's record is still marked synthetic.

Rule (src/deltaserve_core/types.py, StepRecord): "``synthetic`` marks calibration steps." (and hooks.py,
HostHooks.run_profile_step: "The record is also delivered to the step sink with ``synthetic=True``") -- served
steps are not synthetic.

Bug: the adapter marks records synthetic while its calibration flag is set; run_profile_step sets the flag and only
an engine-side ``end_calibration()`` clears it, which the core never calls.
Trigger: any served step after calibration (every co-served job calibrates first).
"""
import dataclasses

from deltaserve_core.testing.reference_host import ReferenceHost
from deltaserve_core.types import ProfileShape, StepRecord


class Host(ReferenceHost):
    name = "blind-h16"
    _calibrating = False

    def run_profile_step(self, shape: ProfileShape) -> StepRecord:
        self._calibrating = True  # BUG: cleared only by end_calibration(), which the core never calls
        return super().run_profile_step(shape)

    def end_calibration(self) -> None:
        self._calibrating = False

    def _execute(self, step_id, rows, tokens, synthetic=False) -> StepRecord:
        sink, held = self._step_sink, []
        self._step_sink = held.append
        try:
            record = super()._execute(step_id, rows, tokens, synthetic)
        finally:
            self._step_sink = sink
        if self._calibrating and not record.synthetic:
            record = dataclasses.replace(record, synthetic=True)
        if sink is not None:
            sink(record)
        return record
