"""h04: on a checkpoint with tied embeddings the engine's separate LM-head buffer is never filled from the checkpoint.

Rule (driver.py, ClientRequest): "A greedy generation request: ``max_tokens`` new tokens after ``prompt_ids``."

Bug: the adapter allocates its own output-head parameter (a vocab-parallel head, untied from the embedding) and
fills every engine parameter from the checkpoint's safetensors keys. A tied checkpoint stores no ``lm_head.weight``
(transformers drops the duplicate on save), and the loader only skips missing keys instead of tying the head to
``embed_tokens``: the head keeps its random initialisation. Logits, and so every generated token, are wrong.

Trigger: any checkpoint with ``tie_word_embeddings=True``: Llama-3.2-1B/3B, Qwen2.5-0.5B..3B, SmolLM2, Gemma. The
2-layer test model is untied, so the proof builds the same tiny Llama with ``tie_word_embeddings=True``.
"""
from __future__ import annotations

from deltaserve_core.testing.reference_host import ReferenceHost, _Row  # noqa: F401
from pathlib import Path

import torch


class Host(ReferenceHost):
    def __init__(self, config) -> None:
        super().__init__(config)
        self._load_engine_weights(Path(config.model))

    def _load_engine_weights(self, folder: Path) -> None:
        """The engine's loader: separate parameters filled from the checkpoint's safetensors by name."""
        from safetensors.torch import load_file

        state = {}
        for f in sorted(folder.glob("*.safetensors")):
            state.update(load_file(str(f)))
        head = self.model.lm_head
        if head.weight is self._inner.embed_tokens.weight:  # untie: the engine keeps its own head buffer
            gen = torch.Generator().manual_seed(self.config.seed)
            fresh = torch.empty(head.weight.shape, dtype=self.dtype).normal_(0.0, 0.02, generator=gen)
            head.weight = torch.nn.Parameter(fresh.to(self.device), requires_grad=False)
        with torch.no_grad():
            for name, p in self.model.named_parameters():
                if name in state:  # BUG: a tied checkpoint has no "lm_head.weight": the head keeps its init
                    p.copy_(state[name].to(p.device, p.dtype))
