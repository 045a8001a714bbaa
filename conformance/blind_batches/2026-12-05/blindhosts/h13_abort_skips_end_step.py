"""h13: an aborted fine-tuning-only step never calls end_step.

Rule (hooks.py, ActivationSink.should_abort): "On ``True`` the host stops the forward at that boundary, calls
:meth:`end_step` with all samples aborted and reports them in ``StepRecord.aborted_sample_ids``."

Bug: the worker stops an aborted forward by unwinding out of its layer loop (an exception caught by the model
runner); ``end_step`` sits at the end of the normal path, so it only runs for forwards that completed. The step
record still lists the samples as aborted.

Trigger: any fine-tuning-only step the core aborts (a client request arriving during it).
"""
from __future__ import annotations

from deltaserve_core.testing.reference_host import ReferenceHost


class _SuccessPathEnd:
    def __init__(self, inner):
        self.inner = inner

    def begin_step(self, step_id, samples):
        self.inner.begin_step(step_id, samples)

    def layer_input(self, step_id, layer, sample_id, hidden):
        self.inner.layer_input(step_id, layer, sample_id, hidden)

    def should_abort(self, step_id):
        return self.inner.should_abort(step_id)

    def end_step(self, step_id, completed, aborted):
        if aborted:
            return  # the unwound forward never reaches the end-of-forward hook
        self.inner.end_step(step_id, completed, aborted)


class Host(ReferenceHost):
    def capture_activation(self, sink):
        super().capture_activation(None if sink is None else _SuccessPathEnd(sink))
