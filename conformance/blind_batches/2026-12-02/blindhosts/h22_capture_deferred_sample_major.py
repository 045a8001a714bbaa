"""Captures are staged during the forward and flushed to the sink after it, sample by sample (one IPC message
per sample): layer_input arrives after the layers ran and, with >= 2 samples, not in layer order."""
from ._base import Patchable


class Host(Patchable):
    name = "blind-h22"

    def _emit_layer_inputs(self, sink, step_id, li, ft_rows, hidden, rows):
        staged = self.__dict__.setdefault("_staged", [])
        for r in ft_rows:
            staged.append((r.sample.sample_id, li, hidden[r.start:r.start + r.length].clone()))

    def _after_forward_captures(self, sink, step_id):
        staged = self.__dict__.pop("_staged", [])
        order = list(dict.fromkeys(sid for sid, _, _ in staged))
        for sid, li, h in sorted(staged, key=lambda x: (order.index(x[0]), x[1])):  # BUG: after forward, sample-major
            sink.layer_input(step_id, li, sid, h)
