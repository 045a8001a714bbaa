"""h06: calibration steps are numbered by their own counter, so step ids repeat once serving starts.

Rule (hooks.py, HostHooks.report_step_time): "exactly one StepRecord per executed step, in step order"; and
run_profile_step: "Execute one synthetic step of ``shape`` through the host's normal path" (its record "is also
delivered to the step sink"): step ids identify steps, one id per step.

Bug: the adapter's profiling path numbers its synthetic steps with a counter of its own (the profile runner's
iteration index), so the first served steps reuse the ids 0, 1, ... of the calibration steps and the records
reaching the step sink go 0, 1, 0, 1, 2, ...
Trigger: any host that calibrates before serving (every start without a stored profile).
"""
import itertools

from deltaserve_core.testing.reference_host import ReferenceHost


class Host(ReferenceHost):
    def run_profile_step(self, shape):
        if not hasattr(self, "_profile_ids"):
            self._profile_ids = itertools.count()
        served, self._step_ids = self._step_ids, self._profile_ids
        try:
            return super().run_profile_step(shape)
        finally:
            self._step_ids = served
