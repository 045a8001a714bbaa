"""Scaling is folded into B at load (one multiply less per row) with an in-place mul_ on a tensor that is the
caller's own whenever device and dtype already match: the core's LoraAdapterState is modified."""
from deltaserve_core.adapter_state import parse_peft_key
from deltaserve_core.testing.reference_host import _Lora

from ._base import Patchable


class Host(Patchable):
    name = "blind-h34"

    def _to_lora(self, state):
        pairs = {}
        for key, t in state.tensors.items():
            layer, module, ab = parse_peft_key(key)
            if ab != "A":
                continue
            b = state.tensors[key[: -len("A.weight")] + "B.weight"].detach().to(self.device, self.dtype)
            b.mul_(state.config.scaling)  # BUG: in place on the caller's tensor when .to() is a no-op
            pairs[(layer, module)] = (t.detach().to(self.device, self.dtype, copy=True), b)
        return _Lora(1.0, pairs)
