"""The engine sorts fine-tuning rows by length (longest first) inside the step; the capture loop walks the sorted
rows but takes sample ids in injection order, so with >= 2 unsorted samples captures go to the wrong sample."""
from ._base import Patchable


class Host(Patchable):
    name = "blind-h21"

    def _emit_layer_inputs(self, sink, step_id, li, ft_rows, hidden, rows):
        ordered = sorted(ft_rows, key=lambda r: -r.length)
        for r_sorted, r_orig in zip(ordered, ft_rows):  # BUG: ids from one order, rows from the other
            sink.layer_input(step_id, li, r_orig.sample.sample_id, hidden[r_sorted.start:r_sorted.start + r_sorted.length])
