"""publish_adapter updates one served adapter in place under the state's plain name (vLLM load_inplace style):
requests in flight on that name keep decoding over KV computed with the previous version's weights."""
from ._base import Patchable


class Host(Patchable):
    name = "blind-h18"

    def publish_adapter(self, state):
        name = state.name  # BUG: same name for every version, weights swapped in place
        self._adapters[name] = self._to_lora(state)
        return name
