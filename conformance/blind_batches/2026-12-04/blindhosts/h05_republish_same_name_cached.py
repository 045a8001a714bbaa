"""Broken host: publishing a name that is already loaded is a cache hit; the new weights are never loaded.

Rule (src/deltaserve_core/hooks.py, HostHooks.publish_adapter): "Make trained weights servable to clients; returns
the client-visible adapter name. ... A host must never serve KV computed with older weights under the returned
name" -- the returned name serves the weights of the ``state`` just published.

Bug: like an engine's LoRA manager keyed by adapter name, ``publish_adapter`` returns early when the name is already
registered ("already loaded").
Trigger: a version is published again with different weights (a job restarted from an earlier checkpoint reaches
the same optimizer step again and re-publishes ``<adapter>@v<step>``): clients keep the first weights.
"""
from deltaserve_core.adapter_state import LoraAdapterState
from deltaserve_core.hostkit import published_name
from deltaserve_core.testing.reference_host import ReferenceHost


class Host(ReferenceHost):
    name = "blind-h05"

    def publish_adapter(self, state: LoraAdapterState) -> str:
        name = published_name(state.name, state.version)
        if name in self._adapters:  # BUG: treated as already loaded
            return name
        self._adapters[name] = self._to_lora(state)
        return name
