"""Broken host: publishing rebuilds the name-sorted LoRA slot table; running requests keep their old slot index.

Rule (src/deltaserve_core/driver.py, ClientRequest.adapter / HostDriver.generate): a request runs on the adapter it
names until it finishes; publish_adapter (hooks.py) "Called by the core per the job's publish policy" -- while
client requests are in flight -- only adds a servable name.

Bug: the engine keeps its LoRA adapters in a table sorted by name and each running sequence holds a slot index;
``publish_adapter`` inserts the new name and rebuilds the table, and sequences already running keep their index,
which now points at another adapter.
Trigger: a publish while a request on a client adapter is decoding, when the published name sorts before it
(``job@v1`` before ``zeta``): the rest of that request runs on the published adapter.
"""
import dataclasses

from deltaserve_core.adapter_state import LoraAdapterState
from deltaserve_core.hooks import RESERVED_ADAPTER_NAME
from deltaserve_core.testing.reference_host import ReferenceHost


class Host(ReferenceHost):
    name = "blind-h12"

    def _slots(self) -> list[str]:
        return sorted(n for n in self._adapters if n != RESERVED_ADAPTER_NAME)

    def publish_adapter(self, state: LoraAdapterState) -> str:
        before = self._slots()
        name = super().publish_adapter(state)
        after = self._slots()
        with self._lock:  # BUG: sequences keep their slot index across the rebuild
            for seq in list(self._running) + list(self._waiting):
                if seq.request.adapter in before:
                    seq.request = dataclasses.replace(seq.request, adapter=after[before.index(seq.request.adapter)])
        return name
