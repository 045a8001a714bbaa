"""Broken host: capabilities() declares mixed_batches=True, the engine's default, whatever the engine was started with.

Rule (src/deltaserve_core/types.py, HostCapabilities): "``mixed_batches``: one step may hold prefill and decode rows
... S-LoRA never mixes them, so the core admits fine-tuning only into prefill steps there." and HostHooks.capabilities
(hooks.py): "What this host supports." -- the declared fact must be what the engine does.

Bug: the capabilities are built from the engine's defaults before the config is applied, so a host started with
``mixed_batches=False`` still declares True.
Trigger: any non-mixed configuration: the core then injects fine-tuning rows into a decode step, which the engine
cannot run (it raises).
"""
import dataclasses

from deltaserve_core.driver import HostConfig
from deltaserve_core.testing.reference_host import ReferenceHost


class Host(ReferenceHost):
    name = "blind-h07"

    def __init__(self, config: HostConfig) -> None:
        super().__init__(config)
        self._capabilities = dataclasses.replace(self._capabilities, mixed_batches=True)  # BUG: engine default
