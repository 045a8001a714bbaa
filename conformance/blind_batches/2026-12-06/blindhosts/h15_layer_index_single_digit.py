"""Broken host: the fine-tuning adapter's layer index is parsed as a single digit.

Rule (hooks.py, HostHooks.set_finetune_adapter): "Fine-tuning rows of later steps must use exactly these weights (the
training path is only exact if the forward sees the current adapter)."

Bug: the adapter's loader maps PEFT keys to the engine's per-layer LoRA slots with a one-digit pattern
(``_LAYER`` below: ``layers.`` followed by exactly one digit). On models with more than 10 layers, ``layers.10`` and
``layers.11`` parse as layer 1: layer 1 ends up with layer 11's LoRA pairs (the last written) and layers 10+ run
without LoRA. Models of up to 10 layers (every small test model) are loaded right.

Trigger: any model with 11 or more decoder layers (every production model).
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
import re

from deltaserve_core.adapter_state import parse_peft_key


_LAYER = re.compile(r"layers\.(\d)")


class Host(ReferenceHost):
    def _to_lora(self, state: LoraAdapterState) -> _Lora:
        pairs: dict[tuple[int, str], tuple[torch.Tensor, torch.Tensor]] = {}
        for key, tensor in state.tensors.items():
            _, module, ab = parse_peft_key(key)
            layer = int(_LAYER.search(key).group(1))  # BUG: one digit
            if ab != "A":
                continue
            b = state.tensors[key[: -len("A.weight")] + "B.weight"]
            if tensor.shape[0] > self.config.max_lora_rank:
                raise ValueError(f"adapter {state.name!r} has rank {tensor.shape[0]} > max_lora_rank="
                                 f"{self.config.max_lora_rank}; raise HostConfig.max_lora_rank")
            # Copies: the core may keep training the tensors it handed over; the host serves this snapshot.
            pairs[(layer, module)] = (tensor.detach().to(self.device, self.dtype, copy=True),
                                      b.detach().to(self.device, self.dtype, copy=True))
        return _Lora(state.config.scaling, pairs)
