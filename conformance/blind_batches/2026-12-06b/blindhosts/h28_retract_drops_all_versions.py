"""h28: retract_adapter(name) unloads every published version of the job, not just ``name``.

Rule (hooks.py, HostHooks.publish_adapter): "The returned name serves exactly ``state``'s weights until that name is
published again"

Bug: the engine registry keys LoRA slots by the job's adapter name with the version as metadata, and the adapter's
retract_adapter unloads by that key (``parse_published_name(name)[0]``): pruning an old version (what the core does
after each publish beyond its keep count) also unloads the newest one. Clients of the current version are then
refused as "unknown adapter".

Trigger: the core retracting an old published version while a newer one is served (every publish past
``checkpoint.keep``).
"""
from __future__ import annotations

from deltaserve_core.testing.reference_host import ReferenceHost, _Row  # noqa: F401
from deltaserve_core.hooks import RESERVED_ADAPTER_NAME
from deltaserve_core.hostkit import parse_published_name


class Host(ReferenceHost):
    def retract_adapter(self, name: str) -> None:
        """Stop serving published version ``name`` (the core prunes old versions)."""
        parsed = parse_published_name(name)
        if parsed is None:
            self._adapters.pop(name, None)
            return
        for other in [n for n in self._adapters if n != RESERVED_ADAPTER_NAME]:
            p = parse_published_name(other)
            if p is not None and p[0] == parsed[0]:  # BUG: unloads by job name: every version of the job goes
                self._adapters.pop(other, None)
