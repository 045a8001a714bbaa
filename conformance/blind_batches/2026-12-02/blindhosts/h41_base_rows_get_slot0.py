"""S-LoRA-style bin bug: once a step runs the multi-adapter LoRA path (two or more adapters in the step), rows
without an adapter keep bin index 0 and get adapter #0 -- the reserved fine-tuning adapter, loaded first."""
import torch

from ._base import RESERVED_ADAPTER_NAME, Patchable


class Host(Patchable):
    name = "blind-h41"

    def _linear(self, x, module, layer, name, groups):
        if len(groups) >= 2 and RESERVED_ADAPTER_NAME in groups:
            covered = torch.cat(list(groups.values()))
            mask = torch.ones(x.shape[0], dtype=torch.bool, device=x.device)
            mask[covered] = False
            base = mask.nonzero().flatten()
            if base.numel():
                groups = dict(groups)
                groups[RESERVED_ADAPTER_NAME] = torch.cat([groups[RESERVED_ADAPTER_NAME], base])  # BUG
        return super()._linear(x, module, layer, name, groups)
