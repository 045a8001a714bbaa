"""h15: steps run by generate() never reach the step sink (the offline path has no stat loggers).

Rule (driver.py, HostDriver.generate): "Steps run meanwhile go through the hooks exactly as in serving (so
fine-tuning rows may join them)." with hooks.py, HostHooks.report_step_time: "exactly one :class:`StepRecord` per
executed step, in step order".

Bug: generate() drives the engine's offline batch loop (vLLM's ``LLM.generate``, which is created with
``disable_log_stats=True``); the adapter delivers step records from the engine's stat-logger callback, so the steps
generate() runs are offered to on_schedule and captured, but produce no StepRecord. submit()/step() are right.

Trigger: every generate() call.
"""
from __future__ import annotations

from deltaserve_core.testing.reference_host import ReferenceHost, _Row  # noqa: F401
from deltaserve_core.driver import run_to_completion


class Host(ReferenceHost):
    def generate(self, requests):
        sink, self._step_sink = self._step_sink, None  # BUG: offline loop runs without the stat logger (no records)
        try:
            return run_to_completion(self, requests)
        finally:
            self._step_sink = sink
