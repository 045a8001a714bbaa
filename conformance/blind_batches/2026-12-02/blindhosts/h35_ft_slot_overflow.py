"""Two GPU LoRA slots (max_loras=2). When one step needs three adapters (two client/published ones plus the reserved
fine-tuning adapter), the overflowing adapter is mapped to slot 0: fine-tuning rows are computed with a client
adapter's weights."""
import torch

from ._base import RESERVED_ADAPTER_NAME, Patchable


class Host(Patchable):
    name = "blind-h35"
    SLOTS = 2

    def _linear(self, x, module, layer, name, groups):
        if len(groups) > self.SLOTS and RESERVED_ADAPTER_NAME in groups:
            groups = dict(groups)
            ft_index = groups.pop(RESERVED_ADAPTER_NAME)
            slot0 = next(iter(groups))
            groups[slot0] = torch.cat([groups[slot0], ft_index])  # BUG: overflow falls back to slot 0
        return super()._linear(x, module, layer, name, groups)
