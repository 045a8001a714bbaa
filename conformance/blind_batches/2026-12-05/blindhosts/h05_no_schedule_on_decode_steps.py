"""h05: on_schedule is not offered decode-only steps (S-LoRA-style admission copied into a mixed-batch engine).

Rule (hooks.py, ScheduleInterceptor.on_schedule): "Called by: the host's scheduler, in the process that forms
batches, exactly once per step, after the host has chosen its inference batch and before it dispatches it";
(types.py, HostCapabilities, ``mixed_batches``): "A host that declares it must run fine-tuning rows injected into
a decode-only step in that step."

Bug: the adapter's scheduler hook was ported from the S-LoRA adapter, where fine-tuning rows only join prefill
steps: it skips the interceptor on every step whose batch holds only decodes, while the host declares
``mixed_batches=True``.

Trigger: any decode-only step (every request's second and later tokens when no prefill is pending).
"""
from __future__ import annotations

from deltaserve_core.testing.reference_host import ReferenceHost


class _PrefillStepsOnly:
    def __init__(self, inner):
        self.inner = inner

    def on_schedule(self, batch):
        if batch.scheduled and not batch.has_prefill:
            return ()
        return self.inner.on_schedule(batch)

    def on_arrival(self, request_id, arrival_time):
        self.inner.on_arrival(request_id, arrival_time)


class Host(ReferenceHost):
    def intercept_schedule(self, interceptor):
        super().intercept_schedule(None if interceptor is None else _PrefillStepsOnly(interceptor))
