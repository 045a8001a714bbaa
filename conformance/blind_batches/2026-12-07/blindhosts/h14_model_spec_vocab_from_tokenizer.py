"""ModelSpec.vocab_size is the tokenizer's vocabulary, not the checkpoint config's.

Rule: types.py, ModelSpec: "``num_layers``, ``hidden_size`` and ``vocab_size`` must be that config's own values,
never an engine's padded sizes."

Bug: the adapter fills vocab_size from the engine's tokenizer (``len(tokenizer)``, what the serving front-end knows)
instead of ``config.vocab_size``. Equal on checkpoints whose embedding has exactly one row per token; smaller on
the many whose embedding is rounded up (Qwen2/2.5: 151665 tokens, 152064 rows; Phi-3, Mistral-Nemo, ...).
Trigger: a checkpoint whose config vocab_size exceeds its tokenizer's size (proof: the tiny model built with
``model_vocab_size=512`` over its 469-token tokenizer). The test checkpoint itself is exact.
"""
from __future__ import annotations

import dataclasses  # noqa: F401
import math  # noqa: F401
import time  # noqa: F401
from collections.abc import Sequence  # noqa: F401

import torch  # noqa: F401
import torch.nn.functional as F  # noqa: F401

from deltaserve_core.adapter_state import LoraAdapterState, parse_peft_key  # noqa: F401
from deltaserve_core.driver import ClientOutput, ClientRequest, check_client_adapter, take_kept  # noqa: F401
from deltaserve_core.hooks import RESERVED_ADAPTER_NAME  # noqa: F401
from deltaserve_core.hostkit import published_name  # noqa: F401
from deltaserve_core.testing.reference_host import ReferenceHost, _Lora, _Row, _Seq  # noqa: F401
from deltaserve_core.types import (  # noqa: F401
    ExecutionMode,
    FineTuneSample,
    ModelSpec,
    ProposedBatch,
    ScheduledRequest,
    StepRecord,
)


class Host(ReferenceHost):
    """model_spec_vocab_from_tokenizer: see the module docstring."""

    def model_spec(self) -> ModelSpec:
        cfg = self.model.config
        from transformers import AutoTokenizer

        vocab = len(AutoTokenizer.from_pretrained(self.config.model))  # BUG: the tokenizer's vocabulary
        return ModelSpec(path=str(self.config.model), architecture=type(self.model).__name__,
                         num_layers=cfg.num_hidden_layers, hidden_size=cfg.hidden_size, vocab_size=vocab,
                         dtype=self.config.dtype)
