"""ModelSpec.hidden_size is the attention width ``num_attention_heads * head_dim``, not the config's hidden_size.

Rule: types.py, ModelSpec: "``num_layers``, ``hidden_size`` and ``vocab_size`` must be that config's own values,
never an engine's padded sizes."

Bug: the adapter fills hidden_size from the engine's attention metadata (``num_heads * head_size``, the o_proj input
width), which equals the config's hidden_size on Llama/Mistral shapes but not on models with an explicit head_dim.
Trigger: a checkpoint whose head_dim * num_attention_heads != hidden_size (Qwen3-0.6B: 16 x 128 = 2048 vs 1024;
Qwen3-4B: 32 x 128 = 4096 vs 2560; Gemma). Proof: the tiny Llama with head_dim 64 (4 x 64 = 256 vs 128). The 2-layer
test checkpoint (4 x 32 = 128) is exact.
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
    RequestSLO,
    ScheduledRequest,
    StepRecord,
)


class Host(ReferenceHost):
    """model_spec_hidden_from_heads: see the module docstring."""

    def model_spec(self) -> ModelSpec:
        cfg = self.model.config
        return ModelSpec(path=str(self.config.model), architecture=type(self.model).__name__,
                         num_layers=cfg.num_hidden_layers, hidden_size=cfg.num_attention_heads * self.head_dim,  # BUG: attention width
                         vocab_size=cfg.vocab_size,
                         dtype=self.config.dtype)
