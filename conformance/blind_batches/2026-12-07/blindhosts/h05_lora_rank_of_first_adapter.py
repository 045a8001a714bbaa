"""The LoRA kernel of a step runs at the rank of the step's first adapter.

Rule: hooks.py, HostHooks.publish_adapter: "The returned name serves exactly ``state``'s weights until that name is
published again"

Bug: the batched LoRA kernel takes its rank from the first adapter group of the step (segment 0) and slices every
other adapter's A/B to it, instead of the largest rank in the step: adapters of a higher rank than the step's first
one lose their trailing rank components.
Trigger: one step serving adapters of different ranks, the lower-rank one first: e.g. a client adapter of rank 4 and
a published job version of rank 8 (also the reserved adapter's fine-tuning rows, which come last, when a client
adapter of lower rank shares their step).
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
    """lora_rank_of_first_adapter: see the module docstring."""

    def _linear(self, x: torch.Tensor, module: torch.nn.Module, layer: int, name: str,
                groups: dict[str, torch.Tensor]) -> torch.Tensor:
        out = module(x)
        kernel_rank = None
        for adapter, index in groups.items():
            lora = self._adapters.get(adapter) or self._withdrawn[adapter]
            pair = lora.pairs.get((layer, name))
            if pair is None:
                continue
            a, b = pair
            if kernel_rank is None:  # BUG: the kernel's rank is the first adapter's
                kernel_rank = a.shape[0]
            a, b = a[:kernel_rank], b[:, :kernel_rank]
            # Same order of operations as PEFT's LoRA layer: B(A(x)) * scaling, added to the base output.
            out.index_add_(0, index, (x.index_select(0, index) @ a.T @ b.T) * lora.scaling)
        return out
