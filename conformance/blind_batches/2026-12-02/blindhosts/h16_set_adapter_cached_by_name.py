"""set_finetune_adapter skips the (expensive) reload when the adapter name is already loaded: the cache key is the
state's name, not its version, so every call after the first is ignored."""
from ._base import RESERVED_ADAPTER_NAME, Patchable


class Host(Patchable):
    name = "blind-h16"

    def set_finetune_adapter(self, state):
        if getattr(self, "_ft_loaded_name", None) == state.name and RESERVED_ADAPTER_NAME in self._adapters:
            return  # BUG: version ignored
        self._ft_loaded_name = state.name
        super().set_finetune_adapter(state)
