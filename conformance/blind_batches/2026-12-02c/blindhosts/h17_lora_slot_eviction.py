"""
h17 - loading the fine-tuning adapter evicts a client adapter from its LoRA slot; its requests then run on the base.

Rule (hooks.py, HostHooks.set_finetune_adapter): "Load or replace the weights of the reserved fine-tuning
adapter." -- only the reserved adapter; and driver.py HostConfig: "``client_adapters`` maps adapter names clients
may use to PEFT folders" (requests on them are served with those weights).

Bug: the engine has ``max_loras`` slots (here: as many as client adapters were configured). The adapter loads the
reserved adapter with the engine's ``add_lora``, which evicts the least recently used slot; its name table still
lists the evicted client adapter, whose requests are then run with no LoRA (vLLM maps an absent id to the base).

Trigger: a host with client adapters filling its slots, once the core installs the fine-tuning adapter.
"""
from __future__ import annotations

from deltaserve_core.hooks import RESERVED_ADAPTER_NAME
from deltaserve_core.testing.reference_host import ReferenceHost, _Lora


class Host(ReferenceHost):
    def set_finetune_adapter(self, state):
        slots = max(1, len(self.config.client_adapters))
        resident = [n for n, a in self._adapters.items() if n != RESERVED_ADAPTER_NAME and a.pairs]
        if RESERVED_ADAPTER_NAME not in self._adapters and len(resident) >= slots:
            victim = resident[0]  # LRU slot evicted; the name stays registered
            self._adapters[victim] = _Lora(self._adapters[victim].scaling, {})
        super().set_finetune_adapter(state)
