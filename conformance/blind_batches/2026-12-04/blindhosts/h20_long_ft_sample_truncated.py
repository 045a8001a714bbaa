"""Broken host: fine-tuning samples longer than the engine's per-request prefill threshold are truncated.

Rule (src/deltaserve_core/hooks.py, HostHooks.intercept_schedule): "adds the returned samples to that same step as
prefill-only rows ... Samples the step cannot take are refused in that step's record (``aborted_sample_ids``)";
ActivationSink.layer_input: "shape ``[num_tokens, hidden_size]``" of the sample.

Bug: the adapter builds each fine-tuning row as an engine request and applies the engine's
``long_prefill_token_threshold`` (128) by cutting the prompt, as the engine does for over-long prompts with
truncation on, instead of refusing the sample.
Trigger: any fine-tuning sample longer than 128 tokens (an ordinary instruction + response).
"""
from deltaserve_core.hooks import ScheduleInterceptor
from deltaserve_core.testing.reference_host import ReferenceHost
from deltaserve_core.types import FineTuneSample

_THRESHOLD = 128


class _Truncating:
    def __init__(self, inner) -> None:
        self.inner = inner

    def on_arrival(self, request_id, arrival_time) -> None:
        self.inner.on_arrival(request_id, arrival_time)

    def on_schedule(self, batch):
        return [s if s.num_tokens <= _THRESHOLD else  # BUG: cut, not refused
                FineTuneSample(s.sample_id, s.input_ids[:_THRESHOLD], s.loss_mask[:_THRESHOLD], s.epoch)
                for s in self.inner.on_schedule(batch)]


class Host(ReferenceHost):
    name = "blind-h20"

    def intercept_schedule(self, interceptor: ScheduleInterceptor | None) -> None:
        super().intercept_schedule(None if interceptor is None else _Truncating(interceptor))
