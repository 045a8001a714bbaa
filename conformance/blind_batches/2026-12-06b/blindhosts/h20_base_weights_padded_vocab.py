"""h20: base_weights() lends the vocab-padded storage of the embedding and the LM head.

Rule (hooks.py, LendsBaseWeights.base_weights): "names are those of
``transformers.AutoModelForCausalLM.from_pretrained(model_spec().path) .named_parameters()``, every one of them" and
"each tensor is a *view* of a weight the engine computes with (never a copy [...]), holds the checkpoint's values".

Bug: like vLLM's ``VocabParallelEmbedding`` / ``ParallelLMHead``, the engine stores the embedding and the head with
the vocabulary padded to a multiple of 64 and computes with the first ``vocab_size`` rows (a view). The adapter
lends the parameters' storage as allocated: ``[padded_vocab, hidden]`` tensors with zero rows appended, so two lent
tensors do not have the checkpoint's shape. Every other lent tensor is a right view. (base LendingHost)

Trigger: any model whose vocabulary is not a multiple of 64 (the test model's 469 -> 512; Qwen2.5-style vocabularies
padded by the engine, many fine-tunes with added tokens).
"""
from __future__ import annotations

import torch

from ._lending import LendingHost

VOCAB_PADDING = 64


class Host(LendingHost):
    def __init__(self, config) -> None:
        super().__init__(config)
        self._padded = {}
        vocab = self.model.config.vocab_size
        size = -(-vocab // VOCAB_PADDING) * VOCAB_PADDING
        for name, mod in (("model.embed_tokens.weight", self._inner.embed_tokens), ("lm_head.weight", self.model.lm_head)):
            w = mod.weight
            buf = torch.zeros(size, w.shape[1], dtype=w.dtype, device=w.device)
            buf[:vocab] = w.detach()
            mod.weight = torch.nn.Parameter(buf[:vocab], requires_grad=False)  # the engine computes with the vocab rows
            self._padded[name] = buf

    def base_weights(self):
        lent = super().base_weights()
        lent.update(self._padded)  # BUG: the padded storage is lent, not the [vocab_size, hidden] view computed with
        return lent
