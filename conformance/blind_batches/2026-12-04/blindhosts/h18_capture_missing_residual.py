"""Broken host: layer inputs are captured without the residual: the previous layer's MLP output is delivered.

Rule (src/deltaserve_core/hooks.py, ActivationSink): "Receives the residual-stream input of every decoder layer for
fine-tuning rows." and ActivationSink.layer_input: "The input of decoder layer ``layer`` for one sample".

Bug: vLLM-style decoder layers take ``(positions, hidden_states, residual)`` and fuse the residual add into the next
layer's input norm; the capture hook takes the ``hidden_states`` argument alone, which for every layer after the
first is the previous layer's MLP output, not the residual stream (layer 0 gets the embeddings, correct).
Trigger: every captured step, every layer but the first.
"""
from deltaserve_core.hooks import ActivationSink
from deltaserve_core.testing.reference_host import ReferenceHost


class _HiddenStatesArg:
    def __init__(self, inner, host) -> None:
        self.inner, self.host = inner, host

    def begin_step(self, step_id, samples) -> None:
        self.inner.begin_step(step_id, samples)

    def layer_input(self, step_id, layer, sample_id, hidden) -> None:
        if layer > 0:  # BUG: the layer's hidden_states argument without the residual added
            start, length = self.host._ft_slices[sample_id]
            hidden = self.host._mlp_out[start:start + length]
        self.inner.layer_input(step_id, layer, sample_id, hidden)

    def should_abort(self, step_id) -> bool:
        return self.inner.should_abort(step_id)

    def end_step(self, step_id, completed, aborted) -> None:
        self.inner.end_step(step_id, completed, aborted)


class Host(ReferenceHost):
    name = "blind-h18"

    def capture_activation(self, sink: ActivationSink | None) -> None:
        super().capture_activation(None if sink is None else _HiddenStatesArg(sink, self))

    def _execute(self, step_id, rows, tokens, synthetic=False):
        self._ft_slices = {r.sample.sample_id: (r.start, r.length) for r in rows if r.sample is not None}
        return super()._execute(step_id, rows, tokens, synthetic)

    def _linear(self, x, module, layer, name, groups):
        out = super()._linear(x, module, layer, name, groups)
        if name == "mlp.down_proj":
            self._mlp_out = out  # what the next layer receives as hidden_states (residual kept apart)
        return out
