"""
h19 - a fine-tuning adapter of higher rank than the LoRA slots is truncated to max_lora_rank instead of refused.

Rule (hooks.py, HostHooks.set_finetune_adapter): "Fine-tuning rows of later steps must use exactly these weights
... A host that cannot apply every target module of ``state`` must refuse it by raising, never run with part of
it."

Bug: the adapter copies the state into the engine's pre-allocated LoRA slot buffers (``[max_lora_rank, in]`` /
``[out, max_lora_rank]``) with ``slot[:r].copy_(A[:max_rank])``-style slicing and no rank check, so ranks above
``max_lora_rank`` are silently cut to the first ``max_lora_rank`` components (client adapters still go through the
engine's checked loader).

Trigger: a job whose LoRA rank exceeds the host's ``max_lora_rank`` (e.g. r=16 on an engine started with
``--max-lora-rank 8``).
"""
from __future__ import annotations

from deltaserve_core.adapter_state import LoraAdapterState
from deltaserve_core.testing.reference_host import ReferenceHost


class Host(ReferenceHost):
    def set_finetune_adapter(self, state):
        k = self.config.max_lora_rank
        tensors = {}
        for key, t in state.tensors.items():  # copy into the slot buffers: extra components fall off
            tensors[key] = t[:k] if ".lora_A." in key else t[:, :k]
        super().set_finetune_adapter(LoraAdapterState(state.name, state.version, state.config, tensors,
                                                      state.base_model_path))
