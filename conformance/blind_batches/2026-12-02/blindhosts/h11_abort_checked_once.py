"""should_abort is polled once, before layer 0 (in the scheduler), not at every decoder-layer boundary."""
from ._base import Patchable


class Host(Patchable):
    name = "blind-h11"

    def _should_check_abort(self, li, ft_only, mixed_ft):
        return ft_only and li == 0  # BUG
