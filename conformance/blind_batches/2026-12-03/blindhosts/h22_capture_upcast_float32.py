"""h22: captured layer inputs are upcast to float32 on a bfloat16/float16 engine.

Rule (types.py, HostCapabilities.activation_dtype): "dtype name ... of captured layer inputs"; hooks.py,
ActivationSink.layer_input: "The input of decoder layer ``layer`` for one sample".

Bug: the capture hook converts the slice it hands over with ``.float()`` ("the sink trains in fp32"), while the
capabilities keep declaring the engine's dtype: on a bf16/fp16 engine every capture is float32 (twice the bytes
the core's buffers are sized for, and not the dtype the backward's recompute expects).
Trigger: every captured row on a half-precision engine (the usual serving dtype).
"""
from deltaserve_core.testing.reference_host import ReferenceHost


class _Sink:
    def __init__(self, inner):
        self.inner = inner

    def begin_step(self, step_id, samples):
        self.inner.begin_step(step_id, samples)

    def layer_input(self, step_id, layer, sample_id, hidden):
        self.inner.layer_input(step_id, layer, sample_id, hidden.float())

    def should_abort(self, step_id):
        return self.inner.should_abort(step_id)

    def end_step(self, step_id, completed, aborted):
        self.inner.end_step(step_id, completed, aborted)


class Host(ReferenceHost):
    def capture_activation(self, sink) -> None:
        super().capture_activation(None if sink is None else _Sink(sink))
