"""h07: run_idle_step reports that a step executed when the interceptor added nothing and nothing ran.

Rule (driver.py, HostDriver.run_idle_step): "Offer the interceptor a step with no client work (the fine-tuning-only
step). Returns whether a step executed."

Bug: the adapter returns True whenever it offered the idle step (the engine loop "ticked"), not whether a forward
ran: with an empty answer from on_schedule there is no step (no record), yet it says there was.
Trigger: every idle offer the core declines (no fine-tuning sample ready, e.g. between optimizer steps).
"""
from deltaserve_core.testing.reference_host import ReferenceHost


class Host(ReferenceHost):
    def run_idle_step(self) -> bool:
        if self.has_unfinished():
            return False
        self._step(allow_idle=True, report_executed=True)
        return True
