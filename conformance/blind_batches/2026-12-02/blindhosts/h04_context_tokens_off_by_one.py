"""ScheduledRequest.context_tokens for decodes counts the token being decoded (KV length after the step)."""
from deltaserve_core.types import ProposedBatch, ScheduledRequest

from ._base import Patchable


class Host(Patchable):
    name = "blind-h04"

    def _view_batch(self, prefills, decodes, left, deferred, step_id, now):
        b = super()._view_batch(prefills, decodes, left, deferred, step_id, now)

        def bump(r: ScheduledRequest) -> ScheduledRequest:
            if r.prefill_tokens:
                return r
            return ScheduledRequest(r.request_id, r.arrival_time, r.prefill_tokens, r.context_tokens + 1,  # BUG
                                    r.output_tokens, r.first_token_time, r.last_token_time, r.slo)

        return ProposedBatch(b.step_id, b.now, tuple(map(bump, b.scheduled)), tuple(map(bump, b.waiting)), b.mode)
