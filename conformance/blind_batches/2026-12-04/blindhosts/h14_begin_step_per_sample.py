"""Broken host: ActivationSink.begin_step is called once per fine-tuning sample, not once per step.

Rule (src/deltaserve_core/hooks.py, ActivationSink.begin_step): "A step carrying ``samples`` is about to run its
forward. Called once per such step, before layer 0."

Bug: the worker registers each fine-tuning request with the sink as it adds the request to its input batch, so
begin_step(step_id, [sample]) is called for every sample of the step.
Trigger: two or more fine-tuning samples in one step.
"""
from deltaserve_core.hooks import ActivationSink
from deltaserve_core.testing.reference_host import ReferenceHost


class _PerRequest:
    def __init__(self, inner) -> None:
        self.inner = inner

    def begin_step(self, step_id, samples) -> None:
        for s in samples:  # BUG: one begin_step per fine-tuning request
            self.inner.begin_step(step_id, [s])

    def layer_input(self, step_id, layer, sample_id, hidden) -> None:
        self.inner.layer_input(step_id, layer, sample_id, hidden)

    def should_abort(self, step_id) -> bool:
        return self.inner.should_abort(step_id)

    def end_step(self, step_id, completed, aborted) -> None:
        self.inner.end_step(step_id, completed, aborted)


class Host(ReferenceHost):
    name = "blind-h14"

    def capture_activation(self, sink: ActivationSink | None) -> None:
        super().capture_activation(None if sink is None else _PerRequest(sink))
