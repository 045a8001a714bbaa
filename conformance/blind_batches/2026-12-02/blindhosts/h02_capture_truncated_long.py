"""Per-sample capture staging buffer of 256 rows: samples longer than 256 tokens are captured clipped."""
from ._base import Patchable

STAGING_ROWS = 256


class Host(Patchable):
    name = "blind-h02"

    def _emit_layer_inputs(self, sink, step_id, li, ft_rows, hidden, rows):
        for r in ft_rows:
            n = min(r.length, STAGING_ROWS)  # BUG: clipped to the staging buffer
            sink.layer_input(step_id, li, r.sample.sample_id, hidden[r.start:r.start + n])
