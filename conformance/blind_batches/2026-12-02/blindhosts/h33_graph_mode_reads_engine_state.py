"""graph_mode reads the engine's running-request count instead of the batch it is given."""
from deltaserve_core.types import ExecutionMode

from ._base import GraphCapable


class Host(GraphCapable):
    name = "blind-h33"

    def graph_mode(self, batch):
        if not batch.has_prefill and 0 < len(self._running) <= self.CAPTURE_MAX:  # BUG: engine state, not batch
            return ExecutionMode.GRAPH
        return ExecutionMode.EAGER
