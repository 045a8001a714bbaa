"""h15: base_weights() leaves out lm_head.weight on a model whose head is not tied.

Rule (hooks.py, LendsBaseWeights.base_weights): "names are those of ``transformers.AutoModelForCausalLM
.from_pretrained(model_spec().path).named_parameters()``, every one of them; a tied output head
(``tie_word_embeddings``) may be left out".

Bug: the adapter lends every engine weight as a view but skips ``lm_head.weight`` unconditionally, assuming the
head is tied to the embedding (true for small Llama/Qwen checkpoints, false for Llama-3-8B and most large ones):
the backward process then ties a head the model does not have.
Trigger: any checkpoint with ``tie_word_embeddings=False``.
"""
from deltaserve_core.testing.reference_host import ReferenceHost


class Host(ReferenceHost):
    def base_weights(self):
        return {name: p.detach() for name, p in self.model.named_parameters() if name != "lm_head.weight"}
