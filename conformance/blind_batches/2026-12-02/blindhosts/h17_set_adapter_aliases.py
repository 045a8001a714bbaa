"""Zero-copy load of the fine-tuning adapter: when device and dtype already match, the host keeps the core's
tensors themselves, so later in-place changes by the core leak into steps before the next set_finetune_adapter."""
from deltaserve_core.adapter_state import parse_peft_key
from deltaserve_core.testing.reference_host import _Lora

from ._base import RESERVED_ADAPTER_NAME, Patchable


class Host(Patchable):
    name = "blind-h17"

    def set_finetune_adapter(self, state):
        pairs = {}
        for key, t in state.tensors.items():
            layer, module, ab = parse_peft_key(key)
            if ab != "A":
                continue
            b = state.tensors[key[: -len("A.weight")] + "B.weight"]
            pairs[(layer, module)] = (t.detach().to(self.device, self.dtype), b.detach().to(self.device, self.dtype))  # BUG: no copy
        self._adapters[RESERVED_ADAPTER_NAME] = _Lora(state.config.scaling, pairs)
