"""The LoRA kernels are wired into the attention projections only: MLP targets (gate/up/down_proj) of an adapter
are silently ignored, for every adapter (client, published, fine-tuning)."""
from ._base import Patchable


class Host(Patchable):
    name = "blind-h20"

    def _to_lora(self, state):
        lora = super()._to_lora(state)
        lora.pairs = {k: v for k, v in lora.pairs.items() if not k[1].startswith("mlp.")}  # BUG
        return lora
