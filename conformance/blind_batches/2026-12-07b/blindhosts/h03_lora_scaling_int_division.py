"""LoRA scaling computed with integer division: ``int(lora_alpha) // r``.

Rule: driver.py, ClientRequest: "A greedy generation request: ``max_tokens`` new tokens after ``prompt_ids``." / HostConfig: "``client_adapters`` maps adapter names clients may use to PEFT folders."

Bug: the engine's LoRA config keeps ``lora_alpha`` and ``r`` as ints and computes ``scaling = lora_alpha // r``
(Python 2 era code paths, C++ kernels' int arguments). Exact whenever alpha is a multiple of r (r 8, alpha 16: the
defaults), wrong otherwise: r 16 / alpha 24 gives 1 instead of 1.5, r 16 / alpha 8 gives 0 (no LoRA at all).
Applies to every adapter the host loads (client adapters, published versions, the fine-tuning adapter).
Trigger: any adapter whose lora_alpha is not a multiple of its rank (common recipes: alpha = r / 2, alpha 16 at
r 32 or 64, alpha 24 at r 16).
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
    """lora_scaling_int_division: see the module docstring."""

    def _to_lora(self, state: LoraAdapterState) -> _Lora:
        pairs: dict[tuple[int, str], tuple[torch.Tensor, torch.Tensor]] = {}
        for key, tensor in state.tensors.items():
            layer, module, ab = parse_peft_key(key)
            if ab != "A":
                continue
            b = state.tensors[key[: -len("A.weight")] + "B.weight"]
            if tensor.shape[0] > self.config.max_lora_rank:
                raise ValueError(f"adapter {state.name!r} has rank {tensor.shape[0]} > max_lora_rank="
                                 f"{self.config.max_lora_rank}; raise HostConfig.max_lora_rank")
            # Copies: the core may keep training the tensors it handed over; the host serves this snapshot.
            pairs[(layer, module)] = (tensor.detach().to(self.device, self.dtype, copy=True),
                                      b.detach().to(self.device, self.dtype, copy=True))
        return _Lora(int(state.config.lora_alpha) // state.config.r, pairs)  # BUG: integer division
