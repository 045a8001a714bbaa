"""h01: capabilities() recomputed on every call from the KV blocks still free.

Rule (hooks.py, HostHooks.capabilities): "What this host supports. Called at start-up; must be cheap and constant
for the host's lifetime."

Bug: like a vLLM adapter that sizes the fine-tuning budget from the KV-cache manager
(``free_blocks * block_size``), ``capabilities()`` rebuilds its HostCapabilities on every call and caps
``max_finetune_tokens_per_step`` by the KV tokens not held by running requests (a KV pool of ``max_batch_tokens``
tokens). The value changes as requests come and go.

Trigger: calling ``capabilities()`` while a client request holds KV (any request after its prefill step).
"""
from __future__ import annotations

from dataclasses import replace

from deltaserve_core.testing.reference_host import ReferenceHost


class Host(ReferenceHost):
    def capabilities(self):
        held = sum(s.context for s in self._running)
        free_kv = max(1, self.config.max_batch_tokens - held)
        return replace(self._capabilities,
                       max_finetune_tokens_per_step=min(self.config.max_batch_tokens, free_kv))
