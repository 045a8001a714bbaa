"""LoRA pairs of the merged gate/up projection are packed as (up, gate).

Rule: hooks.py, HostHooks.publish_adapter: "The returned name serves exactly ``state``'s weights until that name is
published again"

Bug: the engine runs gate_proj and up_proj as one merged column-parallel linear (``gate_up_proj``); the loader packs
the two LoRA slices in (up, gate) order, so gate_proj's LoRA is applied to up_proj's output and vice versa (the
2026-12-03 k/v swap concerned the fused qkv projection of the fine-tuning adapter; this one is the MLP's).
Trigger: any adapter that targets both gate_proj and up_proj ("all-linear" adapters, the default of many recipes):
published versions, client adapters and the fine-tuning adapter alike.
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
    """gate_up_lora_swapped: see the module docstring."""

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
        for layer in sorted({li for li, _ in pairs}):  # BUG: merged gate_up slot packed as (up, gate)
            g, u = pairs.get((layer, "mlp.gate_proj")), pairs.get((layer, "mlp.up_proj"))
            if g is not None and u is not None:
                pairs[(layer, "mlp.gate_proj")], pairs[(layer, "mlp.up_proj")] = u, g
        return _Lora(state.config.scaling, pairs)
