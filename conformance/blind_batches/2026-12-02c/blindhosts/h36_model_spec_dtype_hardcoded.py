"""
h36 - model_spec() reports dtype "float32" whatever dtype the engine serves.

Rule (hooks.py, HostHooks.model_spec): "The served base model, for the backward process and the calibration
store." and types.py ModelSpec: "The served base model as the backward process needs to know it" (its ``dtype``
field: the dtype the model is served in).

Bug: the adapter leaves ``ModelSpec.dtype`` at its default ("float32") instead of the engine's model dtype. A bf16
engine thus tells the backward process to load and compute the base in fp32 (twice the memory; activations
captured in bf16 are replayed against fp32 weights) and files calibration under the wrong dtype.

Trigger: any host started with ``dtype="bfloat16"`` or ``"float16"``.
"""
from __future__ import annotations

import dataclasses

from deltaserve_core.testing.reference_host import ReferenceHost


class Host(ReferenceHost):
    def model_spec(self):
        return dataclasses.replace(super().model_spec(), dtype="float32")  # the field's default
