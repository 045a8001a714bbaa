"""Positions of injected fine-tuning rows are their offsets in the concatenated step (arange over the varlen
buffer) instead of 0..len-1: correct only for a sample that starts the step."""
import torch

from ._base import Patchable


class Host(Patchable):
    name = "blind-h36"

    def _positions(self, rows):
        return torch.cat([torch.arange(r.start, r.start + r.length) if r.sample is not None  # BUG
                          else torch.arange(r.past, r.past + r.length) for r in rows])
