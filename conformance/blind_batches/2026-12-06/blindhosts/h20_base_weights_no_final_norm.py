"""Broken host: ``base_weights()`` leaves out the final norm.

Rule (hooks.py, LendsBaseWeights.base_weights): "names are those of
``transformers.AutoModelForCausalLM.from_pretrained(model_spec().path)
.named_parameters()``, every one of them; a tied output head (``tie_word_embeddings``) may be left out".

Bug: the adapter builds the lent mapping from the engine's modules by hand (embedding, each decoder layer's
parameters, the output head), the way the vLLM/SGLang weight loaders are walked in reverse; the final RMSNorm lives
in the engine's sampler-side module and is forgotten: ``model.norm.weight`` is missing. Every lent tensor is a
correct view.

Trigger: any call of ``base_weights()`` (once per CoServer start).
Base: ``_lending.LendingHost`` (correct: every parameter, as views).
"""
from __future__ import annotations

import time  # noqa: F401
from collections.abc import Sequence  # noqa: F401
from dataclasses import replace  # noqa: F401

import torch  # noqa: F401
import torch.nn.functional as F  # noqa: F401

from deltaserve_core.driver import ClientOutput  # noqa: F401
from deltaserve_core.hooks import RESERVED_ADAPTER_NAME  # noqa: F401
from deltaserve_core.testing.reference_host import ReferenceHost, _Lora, _Row, _Seq  # noqa: F401
from deltaserve_core.types import ExecutionMode, FineTuneSample, ProposedBatch, StepRecord  # noqa: F401
from blindhosts._lending import LendingHost



class Host(LendingHost):
    def base_weights(self):
        inner = self._inner
        lent = {"model.embed_tokens.weight": inner.embed_tokens.weight.detach()}
        for i, layer in enumerate(self._layers):
            for n, p in layer.named_parameters():
                lent[f"model.layers.{i}.{n}"] = p.detach()
        if not getattr(self.model.config, "tie_word_embeddings", False):
            lent["lm_head.weight"] = self.model.lm_head.weight.detach()
        return lent  # BUG: model.norm.weight never added
