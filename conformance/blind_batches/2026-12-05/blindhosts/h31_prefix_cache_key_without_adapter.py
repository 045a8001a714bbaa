"""h31: the prefix cache keys KV by tokens only, so requests on different adapters share cached KV.

Rule (driver.py, ClientRequest / HostConfig.client_adapters): a request is a greedy generation on its own
``adapter`` ("A greedy generation request: ``max_tokens`` new tokens after ``prompt_ids``"; ``client_adapters``
"maps adapter names clients may use to PEFT folders"): its outputs are those of the model with that adapter.

Bug: the block hash of the adapter's prefix cache (``_prefix_cache.PrefixCacheHost``) leaves out the LoRA adapter
(as vLLM's block hashing did before it mixed in the LoRA id): a prompt sent on adapter ``cl`` after the same prompt
was sent on the base model (or another adapter) attends over KV computed without ``cl``.

Trigger: the same prompt prefix (>= 17 tokens) requested on two different adapters (or base and adapter), e.g. a
shared system prompt.
"""
from __future__ import annotations

from blindhosts._prefix_cache import PrefixCacheHost


class Host(PrefixCacheHost):
    def _prefix_key(self, request, m):
        return tuple(request.prompt_ids[:m])
