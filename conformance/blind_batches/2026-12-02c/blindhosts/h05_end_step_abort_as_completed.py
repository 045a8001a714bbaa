"""
h05 - on an aborted fine-tuning-only step, end_step reports every sample as completed.

Rule (hooks.py, ActivationSink.should_abort): "On ``True`` the host stops the forward at that boundary, calls
:meth:`end_step` with all samples aborted and reports them in ``StepRecord.aborted_sample_ids``." and
ActivationSink.end_step: "The forward of a step that carried fine-tuning rows finished (or stopped); ids of each
outcome."

Bug: the worker extension calls ``end_step`` from its per-step "finish" hook with the plan's sample ids as
completed and an empty aborted list (the abort outcome is only propagated to the scheduler side, where the
record is built correctly). The forward does stop and the record lists the samples as aborted.

Trigger: any fine-tuning-only step whose should_abort answers True (a client arrives during an idle step).
"""
from __future__ import annotations

from deltaserve_core.testing.reference_host import ReferenceHost


class _WorkerSink:
    def __init__(self, sink):
        self._sink = sink

    def begin_step(self, step_id, samples):
        self._sink.begin_step(step_id, samples)

    def layer_input(self, step_id, layer, sample_id, hidden):
        self._sink.layer_input(step_id, layer, sample_id, hidden)

    def should_abort(self, step_id):
        return self._sink.should_abort(step_id)

    def end_step(self, step_id, completed, aborted):
        # the worker only knows the plan's sample ids; the abort outcome lives on the scheduler side
        self._sink.end_step(step_id, tuple(completed) + tuple(aborted), ())


class Host(ReferenceHost):
    def capture_activation(self, sink):
        super().capture_activation(None if sink is None else _WorkerSink(sink))
