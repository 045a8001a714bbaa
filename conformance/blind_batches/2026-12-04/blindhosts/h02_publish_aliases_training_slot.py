"""Broken host: publishing the version currently in the training slot serves that slot itself.

Rule (src/deltaserve_core/hooks.py, HostHooks.publish_adapter): "Make trained weights servable to clients; returns
the client-visible adapter name. ... A host must never serve KV computed with older weights under the returned
name (publish under a fresh name/version ...)" -- the returned name serves the published ``state``'s weights.

Bug: the training slot is a static buffer updated in place by ``set_finetune_adapter`` (as CUDA-graph friendly LoRA
slots are); ``publish_adapter`` saves memory when the published version is the one in that slot by registering the
new name as an alias of the slot instead of loading a copy.
Trigger: training goes on after a publish: the next ``set_finetune_adapter`` overwrites the slot, and clients of
the published name silently get the newer, unpublished weights.
"""
from deltaserve_core.adapter_state import LoraAdapterState
from deltaserve_core.hooks import RESERVED_ADAPTER_NAME
from deltaserve_core.hostkit import published_name
from deltaserve_core.testing.reference_host import ReferenceHost


class Host(ReferenceHost):
    name = "blind-h02"

    def set_finetune_adapter(self, state: LoraAdapterState) -> None:
        new = self._to_lora(state)
        cur = self._adapters.get(RESERVED_ADAPTER_NAME)
        same_layout = cur is not None and cur.pairs.keys() == new.pairs.keys() and all(
            cur.pairs[k][0].shape == new.pairs[k][0].shape and cur.pairs[k][1].shape == new.pairs[k][1].shape
            for k in new.pairs)
        if same_layout:  # static slot: update in place (fine on its own: the host still copies the state)
            for k, (a, b) in new.pairs.items():
                cur.pairs[k][0].copy_(a)
                cur.pairs[k][1].copy_(b)
            cur.scaling = new.scaling
        else:
            self._adapters[RESERVED_ADAPTER_NAME] = new
        self._slot_version = (state.name, state.version)

    def publish_adapter(self, state: LoraAdapterState) -> str:
        name = published_name(state.name, state.version)
        if (RESERVED_ADAPTER_NAME in self._adapters
                and getattr(self, "_slot_version", None) == (state.name, state.version)):
            self._adapters[name] = self._adapters[RESERVED_ADAPTER_NAME]  # BUG: alias of the live training slot
        else:
            self._adapters[name] = self._to_lora(state)
        return name
