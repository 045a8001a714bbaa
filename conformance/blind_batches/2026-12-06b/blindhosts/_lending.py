"""A correct ``LendsBaseWeights`` for the reference engine, the base of h20 of this batch (2026-12-06b).

``base_weights()`` lends every parameter of the engine's transformers model under its Hugging Face name, each tensor a
view (``detach()``: same storage) of the weight the engine computes with, in the engine's dtype and on its device.
"""
from __future__ import annotations

from deltaserve_core.testing.reference_host import ReferenceHost


class LendingHost(ReferenceHost):
    def base_weights(self):
        return {name: p.detach() for name, p in self.model.named_parameters()}
