"""h21: the LoRA scaling is folded into the caller's B tensors in place.

Rule (hooks.py, HostHooks.set_finetune_adapter): "The host must copy what it keeps: once the call returns,
``state`` is the caller's to change." (The state belongs to the core, which trains on it; the host may read it,
then keeps its own copy.)

Bug: like vLLM's ``LoRALayerWeights.optimize()`` (``lora_b *= scaling; scaling = 1``), the adapter pre-scales B so
its LoRA kernel needs no scaling argument, but does it on the tensors of the state it was handed before copying
them: the core's adapter (its training weights, on the same device and dtype) is multiplied by alpha/r on every
call. The host's own rows compute correctly.

Trigger: every ``set_finetune_adapter`` whose tensors are on the host's device and dtype (CPU float32 by default).
"""
from __future__ import annotations

from deltaserve_core.hooks import RESERVED_ADAPTER_NAME
from deltaserve_core.testing.reference_host import ReferenceHost


class Host(ReferenceHost):
    def set_finetune_adapter(self, state):
        scaling = state.config.scaling
        for key, tensor in state.tensors.items():
            if key.endswith("lora_B.weight"):
                tensor.detach().to(self.device, self.dtype).mul_(scaling)  # optimize(): fold scaling into B
        lora = self._to_lora(state)
        lora.scaling = 1.0
        self._adapters[RESERVED_ADAPTER_NAME] = lora
