"""A and B are padded to max_lora_rank for the kernels, and scaling is computed with the padded rank
(alpha / max_lora_rank instead of alpha / r). Shared by client, published and fine-tuning adapters."""
from ._base import Patchable


class Host(Patchable):
    name = "blind-h19"

    def _to_lora(self, state):
        lora = super()._to_lora(state)
        lora.scaling = state.config.lora_alpha / self.config.max_lora_rank  # BUG
        return lora
