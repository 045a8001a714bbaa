"""h06: client adapters are loaded with LoRA scaling lora_alpha / r computed from the default alpha (16).

Rule (driver.py, ClientRequest): "A greedy generation request: ``max_tokens`` new tokens after ``prompt_ids``."
(and driver.py, HostConfig: "``client_adapters`` maps adapter names clients may use to PEFT folders.")

Bug: the engine's LoRA loader is handed the adapter's tensors and its rank (read from the A matrix shape); the
adapter builds the slot's scaling from ``LoraConfigSpec(r=rank).scaling``, i.e. the default ``lora_alpha`` 16,
instead of the folder's ``adapter_config.json``. Published versions (from the core's ``LoraAdapterState``) are right.

Trigger: a client adapter trained with ``lora_alpha != 16`` (alpha = 2r = 32 for r=16, alpha 32/64 are common
PEFT recipes). The proof loads a client adapter of r=8, lora_alpha=32.
"""
from __future__ import annotations

from deltaserve_core.testing.reference_host import ReferenceHost, _Row  # noqa: F401
from deltaserve_core.adapter_state import LoraAdapterState
from deltaserve_core.hooks import RESERVED_ADAPTER_NAME, ReservedAdapterError
from deltaserve_core.lora_spec import LoraConfigSpec


class Host(ReferenceHost):
    def load_client_adapter(self, name: str, path: str) -> None:
        if name == RESERVED_ADAPTER_NAME:
            raise ReservedAdapterError(name)
        state = LoraAdapterState.load_pretrained(path, name=name)
        lora = self._to_lora(state)
        rank = next(a.shape[0] for a, _ in lora.pairs.values())
        lora.scaling = LoraConfigSpec(r=rank).scaling  # BUG: default lora_alpha, not the folder's adapter_config
        self._adapters[name] = lora
