"""graph_mode predicts GRAPH for every pure-decode batch up to max_capture_size=256, but graphs were only captured
for sizes 1..8: batches of 9..256 decodes actually run eager (and are reported EAGER)."""
from deltaserve_core.types import ExecutionMode

from ._base import GraphCapable


class Host(GraphCapable):
    name = "blind-h08"

    def graph_mode(self, batch):
        if not batch.has_prefill and 0 < batch.num_decode <= 256:  # BUG: config max, not captured sizes
            return ExecutionMode.GRAPH
        return ExecutionMode.EAGER
