"""Broken host: run_idle_step() runs whatever is queued, and the outputs of that step are thrown away.

Rule (src/deltaserve_core/driver.py, HostDriver.run_idle_step): "Offer the interceptor a step with no client work
(the fine-tuning-only step). Returns whether a step executed." and HostDriver.step: "return the requests that
finished in it" -- every request's output reaches its client.

Bug: the idle step goes straight to the engine's step function without checking for client work first; the step
schedules the queued client requests and, since run_idle_step returns only a bool, the outputs of requests that
finish in it are dropped.
Trigger: a server loop that calls run_idle_step when it last saw the queue empty, while a request has just been
submitted (several requests, one of them short enough to finish in its prefill step).
"""
from deltaserve_core.testing.reference_host import ReferenceHost


class Host(ReferenceHost):
    name = "blind-h09"

    def run_idle_step(self) -> bool:
        # BUG: no has_unfinished() guard
        return bool(self._step(allow_idle=True, report_executed=True))
