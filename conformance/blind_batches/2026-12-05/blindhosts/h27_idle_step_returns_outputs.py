"""h27: run_idle_step returns whether the step produced client outputs, not whether it ran.

Rule (driver.py, HostDriver.run_idle_step): "Returns whether a step executed: True exactly when one ran (its
StepRecord reaches the step sink), False when the interceptor added nothing."

Bug: the adapter implements ``run_idle_step`` on its ``step()`` path and returns ``bool(outputs)``, as if the idle
step's result were the list of finished requests: a fine-tuning-only step never finishes a client request, so it
always answers False, also after running the step and delivering its record.

Trigger: every ``run_idle_step()`` in which the interceptor adds samples.
"""
from __future__ import annotations

from deltaserve_core.testing.reference_host import ReferenceHost


class Host(ReferenceHost):
    def run_idle_step(self):
        if self.has_unfinished():
            return False
        outputs = self._step(allow_idle=True)
        return bool(outputs)
