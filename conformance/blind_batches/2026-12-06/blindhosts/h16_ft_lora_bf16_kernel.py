"""Broken host: the fine-tuning adapter runs through a bfloat16 LoRA kernel on a float32 engine.

Rule (hooks.py, HostHooks.set_finetune_adapter): "Fine-tuning rows of later steps must use exactly these weights (the
training path is only exact if the forward sees the current adapter)."

Bug: the reserved adapter is loaded into a slot allocated by the training-adapter path with the LoRA kernels'
dtype (bfloat16, as Punica-style kernels support fp16/bf16 only); its A/B are rounded to bfloat16 and the LoRA
product of fine-tuning rows is computed in bfloat16 before being added to the float32 base output. Client
adapters keep the engine's dtype.

Trigger: the default float32 engine with any fine-tuning adapter (every capture differs from the adapter's
float32 forward by ~1e-3 relative).
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



class Host(ReferenceHost):
    def set_finetune_adapter(self, state) -> None:
        lora = self._to_lora(state)
        # BUG: the training slot is allocated in the LoRA kernel dtype (bfloat16)
        lora.pairs = {k: (a.to(torch.bfloat16), b.to(torch.bfloat16)) for k, (a, b) in lora.pairs.items()}
        self._adapters[RESERVED_ADAPTER_NAME] = lora

    def _linear(self, x: torch.Tensor, module: torch.nn.Module, layer: int, name: str,
                groups: dict[str, torch.Tensor]) -> torch.Tensor:
        out = module(x)
        for adapter, index in groups.items():
            pair = self._adapters[adapter].pairs.get((layer, name))
            if pair is None:
                continue
            a, b = pair
            # Same order of operations as PEFT's LoRA layer: B(A(x)) * scaling, added to the base output.
            delta = (x.index_select(0, index).to(a.dtype) @ a.T @ b.T) * self._adapters[adapter].scaling
            out.index_add_(0, index, delta.to(out.dtype))
        return out
