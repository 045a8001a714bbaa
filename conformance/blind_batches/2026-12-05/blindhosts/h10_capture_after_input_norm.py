"""h10: captures are the attention block's input (after input_layernorm), not the residual-stream input.

Rule (hooks.py, ActivationSink): "Receives the residual-stream input of every decoder layer for fine-tuning rows";
ActivationSink.layer_input: "The input of decoder layer ``layer`` for one sample".

Bug: the engine fuses the residual add into the layer's first RMSNorm (vLLM's ``input_layernorm(hidden, residual)``),
so the adapter's tap sits where a single tensor is available: the normalised input handed to attention. It hands
``input_layernorm(hidden)`` to the sink for every layer.

Trigger: every captured fine-tuning row, every layer.
"""
from __future__ import annotations

from deltaserve_core.testing.reference_host import ReferenceHost


class _NormTap:
    def __init__(self, inner, layers):
        self.inner, self.layers = inner, layers

    def begin_step(self, step_id, samples):
        self.inner.begin_step(step_id, samples)

    def layer_input(self, step_id, layer, sample_id, hidden):
        self.inner.layer_input(step_id, layer, sample_id, self.layers[layer].input_layernorm(hidden))

    def should_abort(self, step_id):
        return self.inner.should_abort(step_id)

    def end_step(self, step_id, completed, aborted):
        self.inner.end_step(step_id, completed, aborted)


class Host(ReferenceHost):
    def capture_activation(self, sink):
        super().capture_activation(None if sink is None else _NormTap(sink, self._layers))
