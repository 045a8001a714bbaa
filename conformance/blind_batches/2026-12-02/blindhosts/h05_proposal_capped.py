"""To keep on_schedule cheap the adapter offers at most 16 scheduled requests in the ProposedBatch; the engine
still runs all of them."""
from deltaserve_core.types import ProposedBatch

from ._base import Patchable

MAX_OFFERED = 16


class Host(Patchable):
    name = "blind-h05"

    def _view_batch(self, prefills, decodes, left, deferred, step_id, now):
        b = super()._view_batch(prefills, decodes, left, deferred, step_id, now)
        return ProposedBatch(b.step_id, b.now, b.scheduled[:MAX_OFFERED], b.waiting, b.mode)  # BUG
