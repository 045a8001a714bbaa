"""h23: max_finetune_tokens_per_step is the token budget minus a reserve for decode slots.

Rule (types.py, HostCapabilities.max_finetune_tokens_per_step): "largest number of fine-tuning tokens one step may
carry (the host's token budget minus nothing else); the core never injects more."

Bug: the adapter declares ``max_batch_tokens - max_running_requests`` ("keep one token per running request free
for its decode"), so the core never packs fine-tuning rows up to what a step can actually carry (an idle step, with
no decode at all, could take the whole budget) and refuses samples longer than the reduced figure.
Trigger: every host (the declared capability), visible on any fine-tuning-only step near the budget.
"""
import dataclasses

from deltaserve_core.testing.reference_host import ReferenceHost


class Host(ReferenceHost):
    def __init__(self, config) -> None:
        super().__init__(config)
        self._capabilities = dataclasses.replace(
            self._capabilities,
            max_finetune_tokens_per_step=config.max_batch_tokens - config.max_running_requests)
