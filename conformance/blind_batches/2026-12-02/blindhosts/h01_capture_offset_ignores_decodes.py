"""Capture slices computed from the prefill token count only: decode rows (1 token each) are forgotten, so in a
step where fine-tuning rows share the batch with decodes every captured slice is shifted by num_decode rows."""
from ._base import Patchable


class Host(Patchable):
    name = "blind-h01"

    def _emit_layer_inputs(self, sink, step_id, li, ft_rows, hidden, rows):
        off = sum(r.length for r in rows if r.sample is None and r.past == 0)  # BUG: decode rows not counted
        for r in ft_rows:
            sink.layer_input(step_id, li, r.sample.sample_id, hidden[off:off + r.length])
            off += r.length
