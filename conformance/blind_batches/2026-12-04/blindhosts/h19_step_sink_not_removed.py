"""Broken host: report_step_time(None) does not remove the step sink; records keep flowing to the old core.

Rule (src/deltaserve_core/hooks.py, HostHooks.report_step_time): "Install (or remove) the step sink: exactly one
StepRecord per executed step ... A later call replaces the installed sink, which is never called again."

Bug: the adapter registers the sink as an engine output-processor callback and only ever registers: ``None`` is
taken as "nothing to register" and the old callback stays.
Trigger: a fine-tuning job stops (the core uninstalls its hooks with None) while the engine keeps serving.
"""
from deltaserve_core.hooks import StepSink
from deltaserve_core.testing.reference_host import ReferenceHost


class Host(ReferenceHost):
    name = "blind-h19"

    def report_step_time(self, sink: StepSink | None) -> None:
        if sink is not None:  # BUG: None never unregisters the previous callback
            self._step_sink = sink
