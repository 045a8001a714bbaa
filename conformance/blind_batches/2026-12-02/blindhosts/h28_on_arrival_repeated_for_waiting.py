"""Requests left waiting are re-announced with on_arrival at every step they wait ('keep the core's queue fresh')."""
from ._base import Patchable


class Host(Patchable):
    name = "blind-h28"

    def _schedule(self):
        prefills, decodes, left = super()._schedule()
        if self._interceptor is not None:
            for s in left:  # BUG: a second (third...) on_arrival for the same request
                self._interceptor.on_arrival(s.request.request_id, s.arrival_time)
        return prefills, decodes, left
