"""Broken host: publishing beyond ``max_loras`` resident adapters unregisters the oldest published version.

Rule (hooks.py, HostHooks.publish_adapter): "Make trained weights servable to clients; returns the client-visible
adapter name." ... "The returned name serves exactly ``state``'s weights until that name is published again".

Bug: the engine keeps at most ``max_loras`` (default 4, vLLM's default) adapters resident besides the reserved one.
Publishing into a full set evicts the least recently published version, and the adapter removes the evicted name
from its registry too (instead of keeping it loadable from its folder, as vLLM's LRU cache does): a version the core
still serves (it retracts only beyond ``checkpoint.keep``) is refused as an unknown adapter.

Trigger: more published versions plus client adapters than 4 (e.g. two client adapters and three kept versions, or
five publishes without pruning).
"""
from __future__ import annotations

import time  # noqa: F401
from collections.abc import Sequence  # noqa: F401
from dataclasses import replace  # noqa: F401

import torch  # noqa: F401
import torch.nn.functional as F  # noqa: F401

from deltaserve_core.driver import ClientOutput  # noqa: F401
from deltaserve_core.hooks import RESERVED_ADAPTER_NAME  # noqa: F401
from deltaserve_core.testing.reference_host import ReferenceHost, _Lora, _Row, _Seq  # noqa: F401
from deltaserve_core.types import ExecutionMode, FineTuneSample, ProposedBatch, StepRecord  # noqa: F401



class Host(ReferenceHost):
    def __init__(self, config) -> None:
        super().__init__(config)
        self._max_loras = int(config.options.get("max_loras", 4))
        self._publish_order: list[str] = []

    def publish_adapter(self, state) -> str:
        name = super().publish_adapter(state)
        self._publish_order = [n for n in self._publish_order if n != name] + [name]
        resident = [n for n in self._adapters if n != RESERVED_ADAPTER_NAME]
        while len(resident) > self._max_loras and len(self._publish_order) > 1:
            victim = self._publish_order.pop(0)
            self._adapters.pop(victim, None)  # BUG: evicted from the registry, not only from its slot
            resident.remove(victim)
        return name

    def retract_adapter(self, name: str) -> None:
        super().retract_adapter(name)
        self._publish_order = [n for n in self._publish_order if n != name]
