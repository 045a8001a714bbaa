"""Broken host: LoRA on MLP projections is silently skipped (the engine's LoRA kernels cover attention only).

Rule (src/deltaserve_core/hooks.py, HostHooks.set_finetune_adapter): "A host that cannot apply every target module
of ``state`` must refuse it by raising, never run with part of it."

Bug: the adapter keeps only the q/k/v/o projections it has LoRA slots for and logs a warning for the rest
(gate_proj, up_proj, down_proj), then runs.
Trigger: a job whose target_modules include the MLP projections (the common "all linear layers" setting).
"""
import logging

from deltaserve_core.adapter_state import LoraAdapterState, parse_peft_key
from deltaserve_core.testing.reference_host import ReferenceHost

_SUPPORTED = ("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj", "self_attn.o_proj")


class Host(ReferenceHost):
    name = "blind-h04"

    def set_finetune_adapter(self, state: LoraAdapterState) -> None:
        keep = {k: v for k, v in state.tensors.items() if parse_peft_key(k)[1] in _SUPPORTED}
        if len(keep) != len(state.tensors):
            logging.getLogger(__name__).warning("skipping %d LoRA tensors on unsupported modules",
                                                len(state.tensors) - len(keep))  # BUG: runs with part of it
        super().set_finetune_adapter(LoraAdapterState(state.name, state.version, state.config, keep,
                                                      state.base_model_path))
