"""Broken host: fine-tuning samples that do not fit the step's token budget are carried to the next step.

Rule (src/deltaserve_core/hooks.py, HostHooks.intercept_schedule): "adds the returned samples to that same step as
prefill-only rows ... Samples the step cannot take are refused in that step's record (``aborted_sample_ids``),
never carried to a later step."

Bug: the adapter enforces the engine's per-step token budget (max_batch_tokens shared by client and fine-tuning
rows) and, instead of refusing what does not fit, queues it and adds it to the next step it schedules.
Trigger: a step whose client prefill leaves less room than the samples the core returned (a long prompt plus two
fine-tuning samples).
"""
from deltaserve_core.hooks import ScheduleInterceptor
from deltaserve_core.testing.reference_host import ReferenceHost


class _Budgeted:
    def __init__(self, inner, host) -> None:
        self.inner, self.host, self.carry = inner, host, []

    def on_arrival(self, request_id, arrival_time) -> None:
        self.inner.on_arrival(request_id, arrival_time)

    def on_schedule(self, batch):
        offered = self.carry + list(self.inner.on_schedule(batch))
        self.carry = []
        budget = self.host.config.max_batch_tokens - sum(batch.prefill_lengths) - batch.num_decode
        take = []
        for s in offered:
            if s.num_tokens <= budget:
                take.append(s)
                budget -= s.num_tokens
            else:
                self.carry.append(s)  # BUG: carried to the next step instead of refused in this step's record
        return take


class Host(ReferenceHost):
    name = "blind-h13"

    def intercept_schedule(self, interceptor: ScheduleInterceptor | None) -> None:
        super().intercept_schedule(None if interceptor is None else _Budgeted(interceptor, self))
