"""h30: every version is published under the job's stable adapter name, and the prefix cache is not reset.

Rule (hooks.py, HostHooks.publish_adapter): "A host must never serve KV computed with older weights under the
returned name (publish under a fresh name/version or reset its prefix cache)."

Bug: the adapter publishes each version under the job's adapter name itself (one stable model name for clients,
the LoRA slot's weights hot-swapped), while its prefix cache keys KV by adapter name and tokens
(``_prefix_cache.PrefixCacheHost``, correct for versioned names). Nothing resets the cache on publish, so a prompt
whose prefix was cached under the previous version attends over KV computed with the old weights.

Trigger: a second publish while prompts sent to the first are cached, then a request with the same prompt prefix
(>= 17 tokens: one whole block) on the returned name.
"""
from __future__ import annotations

from blindhosts._prefix_cache import PrefixCacheHost


class Host(PrefixCacheHost):
    def publish_adapter(self, state):
        name = state.name  # stable client-visible name; weights swapped in place
        self._adapters[name] = self._to_lora(state)
        return name
