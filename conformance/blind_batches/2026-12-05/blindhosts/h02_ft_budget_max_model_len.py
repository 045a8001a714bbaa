"""h02: max_finetune_tokens_per_step declared as the model's max length, not the per-step token budget.

Rule (types.py, HostCapabilities, ``max_finetune_tokens_per_step``): "It must be the host's whole per-step token
budget (``HostConfig.max_batch_tokens`` for a host started from one): the core subtracts each step's client rows
itself."

Bug: the adapter conflates the longest sequence the engine accepts (vLLM's ``max_model_len``, the checkpoint's
``max_position_embeddings``) with its per-step token budget (``max_num_batched_tokens``), as vLLM itself does when
chunked prefill is off. The engine still takes ``max_batch_tokens`` per step; the declaration is smaller.

Trigger: any host whose model's ``max_position_embeddings`` differs from ``max_batch_tokens`` (the tiny test model:
1024 against the default 2048).
"""
from __future__ import annotations

from dataclasses import replace

from deltaserve_core.driver import HostConfig
from deltaserve_core.testing.reference_host import ReferenceHost


class Host(ReferenceHost):
    def __init__(self, config: HostConfig) -> None:
        super().__init__(config)
        max_model_len = int(getattr(self.model.config, "max_position_embeddings", config.max_batch_tokens))
        self._capabilities = replace(self._capabilities, max_finetune_tokens_per_step=max_model_len)
