"""h04: LoRA weights of k_proj and v_proj are swapped when packed into the fused qkv slots.

Rule (hooks.py, HostHooks.set_finetune_adapter): "Fine-tuning rows of later steps must use exactly these weights
(the training path is only exact if the forward sees the current adapter)." (also client adapters: their outputs).

Bug: the engine fuses q/k/v into one ``qkv_proj``; the adapter stacks the per-module LoRA pairs into the fused slot
in the order (q, v, k) while the kernel slices (q, k, v), so the k_proj adapter is applied to v and vice versa
(shapes agree under GQA with head_dim equal for k and v, so nothing raises).
Trigger: any adapter that targets both k_proj and v_proj (the default q,k,v,o target set).
"""
from deltaserve_core.testing.reference_host import ReferenceHost

_SWAP = {"self_attn.k_proj": "self_attn.v_proj", "self_attn.v_proj": "self_attn.k_proj"}


class Host(ReferenceHost):
    def _to_lora(self, state):
        lora = super()._to_lora(state)
        lora.pairs = {(layer, _SWAP.get(module, module)): pair for (layer, module), pair in lora.pairs.items()}
        return lora
