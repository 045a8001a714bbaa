"""h34: model_spec().dtype is the torch dtype's repr ("torch.float32"), not its name.

Rule (types.py, ModelSpec): "``dtype`` must be the dtype the engine serves the model in (the backward process loads
the base and replays captures in it)." (Dtype names are ``"float32"``, ``"bfloat16"``, ``"float16"``, as in
``HostConfig.dtype`` and ``HostCapabilities.activation_dtype``.)

Bug: the adapter fills the field with ``str(model.dtype)``, which for a torch dtype is ``"torch.float32"`` (vLLM's
``model_config.dtype`` is a ``torch.dtype``): not a dtype name the core or transformers' ``dtype=`` string argument
accepts.

Trigger: every ``model_spec()`` call.
"""
from __future__ import annotations

from dataclasses import replace

from deltaserve_core.testing.reference_host import ReferenceHost


class Host(ReferenceHost):
    def model_spec(self):
        return replace(super().model_spec(), dtype=str(self.model.dtype))
