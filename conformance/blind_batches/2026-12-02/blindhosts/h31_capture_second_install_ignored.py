"""The activation sink is shipped to the forward process once; a later capture_activation(sink) is ignored while a
sink is installed (removal with None still works)."""
from ._base import Patchable


class Host(Patchable):
    name = "blind-h31"

    def capture_activation(self, sink):
        if sink is not None and self._activation_sink is not None:
            return  # BUG: already shipped
        self._activation_sink = sink
