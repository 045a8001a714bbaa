"""
h18 - publishing a version unloads the previous one while requests on it are still running; they finish on the base.

Rule (hooks.py, HostHooks.publish_adapter): "Make trained weights servable to clients; returns the client-visible
adapter name." -- a name the host then serves with those weights (reference_host: "A fresh name per version:
requests on an older version keep their KV"); retiring old versions is the core's call (``retract_adapter``).

Bug: to stay within ``max_loras`` the adapter unloads the previously published version when it publishes the next
(``remove_lora``). Requests still decoding on the old name keep their KV but their remaining tokens are computed
without LoRA (the engine maps a removed id to the base model): their outputs change mid-generation.

Trigger: a publish while a request on the previous published version is in flight.
"""
from __future__ import annotations

from deltaserve_core.hostkit import parse_published_name
from deltaserve_core.testing.reference_host import ReferenceHost, _Lora


class Host(ReferenceHost):
    def publish_adapter(self, state):
        for name, lora in list(self._adapters.items()):
            parsed = parse_published_name(name, state.name)
            if parsed is not None and parsed[1] != state.version:
                self._adapters[name] = _Lora(lora.scaling, {})  # remove_lora: slot freed, id maps to base
        return super().publish_adapter(state)
