"""h29: base_weights() lends the checkpoint's tensors read from disk, not views of the engine's weights.

Rule (hooks.py, LendsBaseWeights.base_weights): "each tensor is a *view* of a weight the engine computes with (never
a copy: a copy costs what lending saves), holds the checkpoint's values, has the activation dtype
(``capabilities().activation_dtype``) and lives on ``capabilities().device``".

Bug: the engine repacks its weights for its kernels (fused qkv / gate_up), so the adapter author, needing Hugging
Face names, reads the checkpoint's safetensors again and lends those tensors, moved to the engine's device and
dtype: the names, values, dtype and device are right, but every tensor is a second copy of the model.

Trigger: any host start with the co-serving core (``base_weights`` is called once per ``CoServer.start``).
"""
from __future__ import annotations

from pathlib import Path

from deltaserve_core.testing.reference_host import ReferenceHost


class Host(ReferenceHost):
    def base_weights(self):
        from safetensors.torch import load_file

        lent = {}
        for f in sorted(Path(self.config.model).glob("*.safetensors")):
            for name, t in load_file(str(f)).items():
                lent[name] = t.to(self.device, self.dtype)
        return lent
