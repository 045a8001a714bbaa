"""h13: layer_input hands the sink ``[1, num_tokens, hidden]`` tensors (a batch dimension left on).

Rule (hooks.py, ActivationSink.layer_input): "The input of decoder layer ``layer`` for one sample: shape
``[num_tokens, hidden_size]``."

Bug: the capture hook is a forward pre-hook on the Hugging Face-style decoder layer module, whose input is
``[batch, seq, hidden]``; the adapter slices the sample's tokens out of it but keeps the leading batch dimension.
Trigger: every captured fine-tuning row.
"""
from deltaserve_core.testing.reference_host import ReferenceHost


class _Sink:
    def __init__(self, inner):
        self.inner = inner

    def begin_step(self, step_id, samples):
        self.inner.begin_step(step_id, samples)

    def layer_input(self, step_id, layer, sample_id, hidden):
        self.inner.layer_input(step_id, layer, sample_id, hidden.unsqueeze(0))

    def should_abort(self, step_id):
        return self.inner.should_abort(step_id)

    def end_step(self, step_id, completed, aborted):
        self.inner.end_step(step_id, completed, aborted)


class Host(ReferenceHost):
    def capture_activation(self, sink) -> None:
        super().capture_activation(None if sink is None else _Sink(sink))
