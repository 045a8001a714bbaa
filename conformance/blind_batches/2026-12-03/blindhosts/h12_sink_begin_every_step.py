"""h12: begin_step/end_step reach the activation sink for every forward, also steps without fine-tuning rows.

Rule (hooks.py, ActivationSink.begin_step): "A step carrying ``samples`` is about to run its forward. Called once
per such step, before layer 0." and end_step: "The forward of a step that carried fine-tuning rows finished".

Bug: the worker-side hook wraps the model runner's ``execute_model`` and calls ``begin_step``/``end_step`` around
every forward, with an empty sample list when the step carries no fine-tuning rows.
Trigger: every client-only step while a sink is installed (all of serving).
"""
from deltaserve_core.testing.reference_host import ReferenceHost


class Host(ReferenceHost):
    def _execute(self, step_id, rows, tokens, synthetic=False):
        sink = self._activation_sink
        plain = sink is not None and not synthetic and not any(r.sample is not None for r in rows)
        if plain:
            sink.begin_step(step_id, ())
        record = super()._execute(step_id, rows, tokens, synthetic)
        if plain:
            sink.end_step(step_id, (), ())
        return record
