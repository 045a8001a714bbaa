"""h12: should_abort is polled once per fine-tuning-only step, not at every layer boundary.

Rule (hooks.py, ActivationSink.should_abort): "Called by: the host at every decoder-layer boundary of a step that
carries *only* fine-tuning rows (hosts with ``supports_abort``). On ``True`` the host stops the forward at that
boundary".

Bug: the adapter reads the abort flag once, when the fine-tuning-only step is dispatched (the flag is shipped to the
worker with the scheduler output), and the worker's layer loop reuses that answer at every later boundary instead
of asking the sink again. A request that arrives after layer 0 started never stops the step.

Trigger: a fine-tuning-only step during which the core's answer turns True after the first boundary (a client
request arriving mid-step), on a host with at least two layers.
"""
from __future__ import annotations

from deltaserve_core.testing.reference_host import ReferenceHost


class _DispatchFlag:
    def __init__(self, inner):
        self.inner = inner
        self.flags = {}

    def begin_step(self, step_id, samples):
        self.inner.begin_step(step_id, samples)

    def layer_input(self, step_id, layer, sample_id, hidden):
        self.inner.layer_input(step_id, layer, sample_id, hidden)

    def should_abort(self, step_id):
        if step_id not in self.flags:
            self.flags = {step_id: self.inner.should_abort(step_id)}
        return self.flags[step_id]

    def end_step(self, step_id, completed, aborted):
        self.inner.end_step(step_id, completed, aborted)


class Host(ReferenceHost):
    def capture_activation(self, sink):
        super().capture_activation(None if sink is None else _DispatchFlag(sink))
