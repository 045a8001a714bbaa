"""capabilities() reports the FT token budget left after the KV of running requests (a live value)."""
import dataclasses

from ._base import Patchable


class Host(Patchable):
    name = "blind-h32"

    def capabilities(self):
        used = sum(s.context for s in self._running)
        return dataclasses.replace(self._capabilities,  # BUG: changes over the host's lifetime
                                   max_finetune_tokens_per_step=max(1, self.config.max_batch_tokens - used))
