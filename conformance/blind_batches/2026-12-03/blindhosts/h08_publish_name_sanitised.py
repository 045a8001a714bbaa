"""h08: a published adapter is registered in the engine under a sanitised name, not the name returned.

Rule (hooks.py, HostHooks.publish_adapter): "Clients must be able to request the returned name exactly as returned,
whatever the job's adapter name holds (capitals, digits, ``_``, ``-``, ``.``): the core hands it to clients
verbatim."

Bug: the engine uses LoRA names as file-system/module keys, so the adapter registers the weights under the name
with every character outside ``[A-Za-z0-9_@-]`` replaced by ``_`` and returns the unsanitised name: a job adapter
named like a model version (``llama3.1-sql``) publishes ``llama3.1-sql@v3``, which clients then cannot request.
Trigger: a job adapter name containing a ``.`` (or any other character outside the set).
"""
import re

from deltaserve_core.hostkit import published_name
from deltaserve_core.testing.reference_host import ReferenceHost


class Host(ReferenceHost):
    def publish_adapter(self, state) -> str:
        name = published_name(state.name, state.version)
        self._adapters[re.sub(r"[^A-Za-z0-9_@-]", "_", name)] = self._to_lora(state)
        return name
