"""When requests are left waiting (budget or max_running_requests reached), the adapter runs the scheduler's second
pass and asks the interceptor again with the same batch, keeping the second answer: two on_schedule calls per step."""
from ._base import Patchable


class Host(Patchable):
    name = "blind-h03"

    def _ask(self, batch, allow_idle):
        samples = super()._ask(batch, allow_idle)
        if self._interceptor is not None and any(r.first_token_time is None for r in batch.waiting):
            samples = tuple(self._interceptor.on_schedule(batch))  # BUG: second call for the same step
        return samples
