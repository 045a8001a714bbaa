"""On should_abort the adapter stops feeding the sink but lets the forward run to the end (abort = stop capture)."""
from ._base import Patchable


class Host(Patchable):
    name = "blind-h10"

    def _on_abort_continue(self):
        return True  # BUG
