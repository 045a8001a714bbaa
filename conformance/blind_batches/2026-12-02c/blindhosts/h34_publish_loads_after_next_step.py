"""
h34 - publish_adapter returns the new name before its weights are in the engine; the first step runs it on the base.

Rule (hooks.py, HostHooks.publish_adapter): "Make trained weights servable to clients; returns the client-visible
adapter name." -- once it returns, requests on that name are served with ``state``'s weights.

Bug: the adapter registers the name in its table at once and sends the weights to the worker asynchronously; the
worker installs them after the forward it is running (or the next one). Until then the name maps to an empty slot,
so a request submitted right after the publish gets its prefill (KV and first token) computed without the LoRA;
later tokens use the weights but attend over base-model KV.

Trigger: a client request on the freshly published name submitted before the engine ran another step (clients
polling for the new version and using it at once).
"""
from __future__ import annotations

from deltaserve_core.hostkit import published_name
from deltaserve_core.testing.reference_host import ReferenceHost, _Lora


class Host(ReferenceHost):
    def __init__(self, config):
        super().__init__(config)
        self._pending: list[tuple[str, _Lora]] = []

    def publish_adapter(self, state):
        name = published_name(state.name, state.version)
        lora = self._to_lora(state)
        self._adapters[name] = _Lora(lora.scaling, {})  # name known now, weights still on their way
        self._pending.append((name, lora))
        return name

    def _execute(self, step_id, rows, tokens, synthetic=False):
        record = super()._execute(step_id, rows, tokens, synthetic)
        while self._pending:  # the worker installs weights after its current forward
            name, lora = self._pending.pop(0)
            self._adapters[name] = lora
        return record
