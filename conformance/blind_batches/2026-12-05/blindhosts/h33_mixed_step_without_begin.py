"""h33: fine-tuning rows that share a step with client rows are captured without begin_step.

Rule (hooks.py, ActivationSink.begin_step): "A step carrying ``samples`` is about to run its forward. Called once per
such step, before layer 0."

Bug: the worker has two capture paths: fine-tuning-only steps (run by the idle path, which brackets the forward with
``begin_step``/``end_step``) and fine-tuning rows riding along a client step, where the adapter's pre-forward hook
only registers the rows' slices; there ``begin_step`` is never called, although ``layer_input`` and ``end_step``
are.

Trigger: any step carrying both client rows and fine-tuning rows (mixed-batch hosts admit into them by default).
"""
from __future__ import annotations

from deltaserve_core.testing.reference_host import ReferenceHost


class _Tap:
    def __init__(self, inner, host):
        self.inner, self.host = inner, host

    def begin_step(self, step_id, samples):
        if self.host._ft_only_step:
            self.inner.begin_step(step_id, samples)

    def layer_input(self, step_id, layer, sample_id, hidden):
        self.inner.layer_input(step_id, layer, sample_id, hidden)

    def should_abort(self, step_id):
        return self.inner.should_abort(step_id)

    def end_step(self, step_id, completed, aborted):
        self.inner.end_step(step_id, completed, aborted)


class Host(ReferenceHost):
    _ft_only_step = False

    def capture_activation(self, sink):
        super().capture_activation(None if sink is None else _Tap(sink, self))

    def _execute(self, step_id, rows, tokens, synthetic=False):
        self._ft_only_step = bool(rows) and all(r.sample is not None for r in rows)
        return super()._execute(step_id, rows, tokens, synthetic)
