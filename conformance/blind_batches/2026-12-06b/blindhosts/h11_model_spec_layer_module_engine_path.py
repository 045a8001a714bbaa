"""h11: ModelSpec.layer_module names the decoder-layer list by the engine's module path ("model.model.layers").

Rule (types.py, ModelSpec): "``layer_module`` is the dotted attribute path of the decoder-layer list in a
transformers model (``"model.layers"`` for Llama-style families)."

Bug: the adapter fills ``layer_module`` from the path its own layer tap uses inside the engine's model runner (the
runner's ``model`` attribute wraps the ``*ForCausalLM``, whose ``model`` holds ``layers``): ``"model.model.layers"``.
Resolved on a transformers model (what the backward process loads) the path does not exist.

Trigger: every host start (model_spec() is read at start-up).
"""
from __future__ import annotations

from deltaserve_core.testing.reference_host import ReferenceHost, _Row  # noqa: F401
from dataclasses import replace


class Host(ReferenceHost):
    def model_spec(self):
        spec = super().model_spec()
        return replace(spec, layer_module="model.model.layers")  # BUG: the engine runner's path, not transformers'
