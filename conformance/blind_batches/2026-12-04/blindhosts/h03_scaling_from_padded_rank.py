"""Broken host: LoRA scaling is computed from the padded slot rank (max_lora_rank), not the adapter's rank.

Rule (src/deltaserve_core/hooks.py, HostHooks.set_finetune_adapter): "Fine-tuning rows of later steps must use
exactly these weights (the training path is only exact if the forward sees the current adapter)"; the adapter's
scaling is ``LoraConfigSpec.scaling`` = lora_alpha / r (src/deltaserve_core/lora_spec.py), as in PEFT.

Bug: the engine pads every adapter's A/B to ``max_lora_rank`` for its batched LoRA kernel and derives the scaling
from the padded rank: ``lora_alpha / max_lora_rank``.
Trigger: any adapter whose rank is below ``HostConfig.max_lora_rank`` (the default 16 against the usual r=8): its
delta is applied at half strength (client adapters, published and fine-tuning adapters alike).
"""
from deltaserve_core.adapter_state import LoraAdapterState
from deltaserve_core.testing.reference_host import ReferenceHost, _Lora


class Host(ReferenceHost):
    name = "blind-h03"

    def _to_lora(self, state: LoraAdapterState) -> _Lora:
        lora = super()._to_lora(state)
        # BUG: the slot is padded to max_lora_rank and the scaling taken from the padded shape
        return _Lora(state.config.lora_alpha / self.config.max_lora_rank, lora.pairs)
