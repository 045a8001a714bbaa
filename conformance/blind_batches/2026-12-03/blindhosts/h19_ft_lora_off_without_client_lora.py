"""h19: fine-tuning rows run on the base model when no client row of the step uses a LoRA adapter.

Rule (hooks.py, HostHooks.intercept_schedule): the host "adds the returned samples to that same step as
prefill-only rows on the reserved adapter"; set_finetune_adapter: "Fine-tuning rows of later steps must use
exactly these weights".

Bug: the engine skips LoRA for a step whose client requests carry no LoRA request (vLLM's ``set_active_loras``
is only called when ``lora_requests`` is non-empty); the adapter inserts the fine-tuning rows after that
decision, so in a step whose clients are all on the base model, or a fine-tuning-only step, they run without the
reserved adapter.
Trigger: fine-tuning rows in any step without client LoRA rows (clients on the base model, idle steps).
"""
import dataclasses

from deltaserve_core.testing.reference_host import ReferenceHost


class Host(ReferenceHost):
    def _execute(self, step_id, rows, tokens, synthetic=False):
        if not any(r.adapter is not None for r in rows if r.sample is None):
            rows = [dataclasses.replace(r, adapter=None) if r.sample is not None else r for r in rows]
        return super()._execute(step_id, rows, tokens, synthetic)
