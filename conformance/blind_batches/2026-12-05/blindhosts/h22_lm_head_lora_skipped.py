"""h22: LoRA targets outside the decoder layers (lm_head, embed_tokens) are skipped with a warning.

Rule (hooks.py, HostHooks.set_finetune_adapter): "A host that cannot apply every target module of ``state`` must
refuse it by raising, never run with part of it."

Bug: the adapter's LoRA loader walks the state's keys and, for a key it cannot map to a decoder-layer module (a
``lm_head`` or ``embed_tokens`` LoRA, which the engine's LoRA kernels do not support), logs a warning and goes on,
as vLLM's loader long did for unsupported modules. The fine-tuning rows then run without those modules' LoRA.

Trigger: a job whose ``target_modules`` include ``lm_head`` (or ``embed_tokens``).
"""
from __future__ import annotations

import logging

from deltaserve_core.adapter_state import parse_peft_key
from deltaserve_core.testing.reference_host import ReferenceHost, _Lora

log = logging.getLogger(__name__)


class Host(ReferenceHost):
    def _to_lora(self, state):
        pairs = {}
        for key, tensor in state.tensors.items():
            try:
                layer, module, ab = parse_peft_key(key)
            except ValueError:
                log.warning("LoRA weight %s targets a module this engine cannot apply LoRA to; skipped", key)
                continue
            if ab != "A":
                continue
            b = state.tensors[key[: -len("A.weight")] + "B.weight"]
            if tensor.shape[0] > self.config.max_lora_rank:
                raise ValueError(f"adapter {state.name!r} has rank {tensor.shape[0]} > max_lora_rank="
                                 f"{self.config.max_lora_rank}; raise HostConfig.max_lora_rank")
            pairs[(layer, module)] = (tensor.detach().to(self.device, self.dtype, copy=True),
                                      b.detach().to(self.device, self.dtype, copy=True))
        return _Lora(state.config.scaling, pairs)
