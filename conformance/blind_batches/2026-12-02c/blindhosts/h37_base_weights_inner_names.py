"""
h37 - base_weights() lends the decoder's parameters under the inner module's names (no ``model.`` prefix, no head).

Rule (hooks.py, LendsBaseWeights.base_weights): "names are those of ``transformers.AutoModelForCausalLM
.from_pretrained(model_spec().path).named_parameters()``, every one of them; a tied output head
(``tie_word_embeddings``) may be left out".

Bug: the adapter lends ``engine_model.model.named_parameters()`` (the decoder stack the engine exposes, as SGLang's
``model.model``): every name lacks the ``model.`` prefix and the untied ``lm_head.weight`` is missing. The tensors
are genuine views with the right dtype and device.

Trigger: any core start on this host (the core asks once per start), with an untied head.
"""
from __future__ import annotations

from deltaserve_core.testing.reference_host import ReferenceHost


class Host(ReferenceHost):
    def base_weights(self):
        return {name: p.detach() for name, p in self._inner.named_parameters()}
