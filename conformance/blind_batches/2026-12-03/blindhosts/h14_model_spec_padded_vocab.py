"""h14: model_spec() reports the engine's padded vocabulary size, not the checkpoint's.

Rule (types.py, ModelSpec): "The served base model as the backward process needs to know it" (``vocab_size`` of the
checkpoint at ``path``; hooks.py, HostHooks.model_spec: "The served base model").

Bug: the adapter reads the vocabulary size from the engine's output head, which pads it to a multiple of 64 for
its kernels (vLLM's ``ParallelLMHead``/``VocabParallelEmbedding`` padding), so a checkpoint with 469 tokens is
reported as 512.
Trigger: any checkpoint whose vocabulary is not a multiple of 64 (most tokenizers with added special tokens).
"""
import dataclasses

from deltaserve_core.testing.reference_host import ReferenceHost


class Host(ReferenceHost):
    def model_spec(self):
        spec = super().model_spec()
        return dataclasses.replace(spec, vocab_size=-(-spec.vocab_size // 64) * 64)
