"""
h03 - capabilities() declares activation_dtype "float32" whatever dtype the engine runs in.

Rule (types.py, HostCapabilities): "``activation_dtype``: dtype name (``"float32"``, ``"bfloat16"``,
``"float16"``) of captured layer inputs."

Bug: the adapter's capabilities were written against the CPU test setup and hard-code ``activation_dtype="float32"``
(the default of the field) instead of the engine's model dtype. Captures are delivered in the engine's dtype, so a
bf16/fp16 deployment declares float32 while handing bfloat16 tensors (the core sizes its activation buffer and
the backward's dtype from the declaration).

Trigger: any host started with ``dtype="bfloat16"`` or ``"float16"`` (every GPU deployment).
"""
from __future__ import annotations

import dataclasses

from deltaserve_core.testing.reference_host import ReferenceHost


class Host(ReferenceHost):
    def __init__(self, config):
        super().__init__(config)
        self._capabilities = dataclasses.replace(self._capabilities, activation_dtype="float32")
