"""intercept_schedule(None) is ignored (the install is guarded by 'if interceptor'): the old interceptor stays."""
from ._base import Patchable


class Host(Patchable):
    name = "blind-h30"

    def intercept_schedule(self, interceptor):
        if interceptor:  # BUG
            self._interceptor = interceptor
