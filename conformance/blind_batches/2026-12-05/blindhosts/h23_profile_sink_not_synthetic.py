"""h23: the calibration step's record reaches the step sink marked as a served step.

Rule (hooks.py, HostHooks.run_profile_step): "The record is also delivered to the step sink with
``synthetic=True``, exactly once like every step's."

Bug: the profile step goes through the engine's normal step, whose post-step hook builds the record without knowing
the step is a calibration step (``synthetic=False``) and delivers it; ``run_profile_step`` sets ``synthetic=True``
only on the record it returns to its caller.

Trigger: any ``run_profile_step`` while a step sink is installed.
"""
from __future__ import annotations

from dataclasses import replace

from deltaserve_core.testing.reference_host import ReferenceHost


class Host(ReferenceHost):
    def run_profile_step(self, shape):
        sink = self._step_sink
        if sink is not None:
            self._step_sink = lambda record: sink(replace(record, synthetic=False))  # the engine's own hook
        try:
            record = super().run_profile_step(shape)
        finally:
            self._step_sink = sink
        return replace(record, synthetic=True)
