"""Broken host: the fine-tuning adapter's tensors are kept by reference, not copied.

Rule (src/deltaserve_core/hooks.py, HostHooks.set_finetune_adapter): "Fine-tuning rows of later steps must use
exactly these weights ... The host must copy what it keeps: once the call returns, ``state`` is the caller's to
change."

Bug: the adapter moves A/B with ``tensor.to(device, dtype)`` (no ``copy=True``), which on the same device and
dtype returns the caller's own tensor, so the engine's LoRA slot aliases the core's training tensors.
Trigger: the core updates its adapter tensors in place (an optimizer step) after handing a state over: the
fine-tuning rows of the next step run on weights that were never installed.
"""
from deltaserve_core.adapter_state import LoraAdapterState, parse_peft_key
from deltaserve_core.hooks import RESERVED_ADAPTER_NAME
from deltaserve_core.testing.reference_host import ReferenceHost, _Lora


class Host(ReferenceHost):
    name = "blind-h01"

    def set_finetune_adapter(self, state: LoraAdapterState) -> None:
        pairs = {}
        for key, tensor in state.tensors.items():
            layer, module, ab = parse_peft_key(key)
            if ab != "A":
                continue
            b = state.tensors[key[: -len("A.weight")] + "B.weight"]
            if tensor.shape[0] > self.config.max_lora_rank:
                raise ValueError(f"adapter {state.name!r} has rank {tensor.shape[0]} > max_lora_rank="
                                 f"{self.config.max_lora_rank}")
            # BUG: .to() without copy=True is a no-op on the same device/dtype: the slot aliases the caller's tensors
            pairs[(layer, module)] = (tensor.detach().to(self.device, self.dtype),
                                      b.detach().to(self.device, self.dtype))
        self._adapters[RESERVED_ADAPTER_NAME] = _Lora(state.config.scaling, pairs)
