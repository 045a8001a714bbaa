"""h21: the LoRA adapter table is a process-wide singleton shared by every host of the process.

Rule (hooks.py, HostHooks.set_finetune_adapter): "Fine-tuning rows of later steps must use exactly these weights"

Bug: the engine's LoRA manager is a module-level singleton (one table per process, as engines that assume one
engine per process keep it); the adapter registers its client adapters, published versions and the reserved
adapter in it. With two hosts in one process, ``set_finetune_adapter`` on one replaces the reserved adapter the
other's fine-tuning rows run on (and names published on one are servable on the other).

Trigger: two hosts alive in one process: a restart that builds the new host before the old one is collected, a
server co-serving two jobs, a test harness.
"""
from __future__ import annotations

from deltaserve_core.testing.reference_host import ReferenceHost, _Row  # noqa: F401


_ENGINE_LORA_TABLE: dict = {}  # the engine's LoRA manager: one per process


class Host(ReferenceHost):
    def __init__(self, config) -> None:
        super().__init__(config)
        _ENGINE_LORA_TABLE.update(self._adapters)
        self._adapters = _ENGINE_LORA_TABLE  # BUG: every host of the process shares (and overwrites) one table
