"""The modules that get a LoRA delta in a step are those the step's first adapter targets.

Rule: hooks.py, HostHooks.set_finetune_adapter: "Fine-tuning rows of later steps must use exactly these weights (the training path is only exact if the forward sees the current adapter)." / hooks.py, HostHooks.publish_adapter: "The returned name serves exactly ``state``'s weights until that name is published again"

Bug: the multi-LoRA layer wrapper decides per step which projections run the LoRA kernels from the first adapter of
the batch (its target modules), then applies every adapter of the step on those projections only: an adapter that
targets more modules than the step's first one loses the others. Steps with one adapter, or adapters of equal target
sets, are exact.
Trigger: one step with adapters of different target modules, the narrower first: a client adapter on q_proj/v_proj
(the PEFT default) batched with fine-tuning rows (always last) or a published version of q/k/v/o.
"""
from __future__ import annotations

import dataclasses  # noqa: F401
import math  # noqa: F401
import time  # noqa: F401
from collections.abc import Sequence  # noqa: F401

import torch  # noqa: F401
import torch.nn.functional as F  # noqa: F401

from deltaserve_core.adapter_state import LoraAdapterState, parse_peft_key  # noqa: F401
from deltaserve_core.driver import ClientOutput, ClientRequest, check_client_adapter, run_to_completion, take_kept  # noqa: F401
from deltaserve_core.hooks import RESERVED_ADAPTER_NAME  # noqa: F401
from deltaserve_core.hostkit import profile_seed, published_name  # noqa: F401
from deltaserve_core.testing.reference_host import ReferenceHost, _as_list, _Lora, _Row, _Seq  # noqa: F401
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
    """lora_targets_of_first_adapter: see the module docstring."""

    def _linear(self, x: torch.Tensor, module: torch.nn.Module, layer: int, name: str,
                groups: dict[str, torch.Tensor]) -> torch.Tensor:
        out = module(x)
        first = next(iter(groups), None)  # BUG: the step's LoRA-wrapped modules are those of its first adapter
        lead = (self._adapters.get(first) or self._withdrawn[first]) if first is not None else None
        for adapter, index in groups.items():
            lora = self._adapters.get(adapter) or self._withdrawn[adapter]
            pair = lora.pairs.get((layer, name))
            if pair is None or (layer, name) not in lead.pairs:  # BUG (see above)
                continue
            a, b = pair
            # Same order of operations as PEFT's LoRA layer: B(A(x)) * scaling, added to the base output.
            out.index_add_(0, index, (x.index_select(0, index) @ a.T @ b.T) * lora.scaling)
        return out
