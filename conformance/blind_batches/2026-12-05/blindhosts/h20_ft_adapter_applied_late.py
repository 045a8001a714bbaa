"""h20: a replaced fine-tuning adapter takes effect one step late (staged, swapped after the next forward).

Rule (hooks.py, HostHooks.set_finetune_adapter): "Fine-tuning rows of later steps must use exactly these weights
(the training path is only exact if the forward sees the current adapter)."

Bug: to avoid touching LoRA slots while the worker may be mid-forward, the adapter stages a replacement and the
worker swaps it in at the end of its next forward (double buffering with the swap on the wrong side of the step).
The first load is applied at once; every later ``set_finetune_adapter`` is seen one step late, so the first step
after each optimizer step runs its fine-tuning rows on the previous weights.

Trigger: a fine-tuning step right after any second or later ``set_finetune_adapter`` (every optimizer step).
"""
from __future__ import annotations

from deltaserve_core.hooks import RESERVED_ADAPTER_NAME
from deltaserve_core.testing.reference_host import ReferenceHost


class Host(ReferenceHost):
    _staged = None

    def set_finetune_adapter(self, state):
        lora = self._to_lora(state)
        if RESERVED_ADAPTER_NAME not in self._adapters:
            self._adapters[RESERVED_ADAPTER_NAME] = lora
        else:
            self._staged = lora

    def _execute(self, step_id, rows, tokens, synthetic=False):
        record = super()._execute(step_id, rows, tokens, synthetic)
        if self._staged is not None:
            self._adapters[RESERVED_ADAPTER_NAME], self._staged = self._staged, None
        return record
