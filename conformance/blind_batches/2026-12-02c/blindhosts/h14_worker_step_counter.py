"""
h14 - the activation sink is called with the worker's own forward counter as step_id, not the scheduler's step id.

Rule (hooks.py, ActivationSink.begin_step / layer_input / end_step): each is called with the ``step_id`` of "A step
carrying ``samples``" -- the step the scheduler proposed to ``on_schedule`` (``ProposedBatch.step_id``) and
reports in its ``StepRecord.step_id``; the core matches captures to admissions and records by that id.

Bug: the worker extension (another process in vLLM/SGLang) has no access to the scheduler's step ids and numbers
the forwards it executes itself. The two agree while every proposed step runs; as soon as one proposal executes
nothing (an idle step offered to the core that declined to inject, or a step with nothing scheduled), the worker's
ids lag behind by one for the rest of the run.

Trigger: any idle proposal that does not execute (``run_idle_step`` while the core has nothing to admit), followed
by a step carrying fine-tuning rows.
"""
from __future__ import annotations

import itertools

from deltaserve_core.testing.reference_host import ReferenceHost


class _WorkerSink:
    def __init__(self, sink, host):
        self._sink, self._host = sink, host

    def begin_step(self, step_id, samples):
        self._sink.begin_step(self._host._forward_id, samples)

    def layer_input(self, step_id, layer, sample_id, hidden):
        self._sink.layer_input(self._host._forward_id, layer, sample_id, hidden)

    def should_abort(self, step_id):
        return self._sink.should_abort(self._host._forward_id)

    def end_step(self, step_id, completed, aborted):
        self._sink.end_step(self._host._forward_id, completed, aborted)


class Host(ReferenceHost):
    def __init__(self, config):
        super().__init__(config)
        self._forwards = itertools.count()
        self._forward_id = -1

    def capture_activation(self, sink):
        super().capture_activation(None if sink is None else _WorkerSink(sink, self))

    def _execute(self, step_id, rows, tokens, synthetic=False):
        self._forward_id = next(self._forwards)  # the worker counts the forwards it runs
        return super()._execute(step_id, rows, tokens, synthetic)
