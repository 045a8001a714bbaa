"""Adapters whose rank equals ``max_lora_rank`` are refused (``>=`` where ``>`` is meant).

Rule: hooks.py, HostHooks.set_finetune_adapter: "Fine-tuning rows of later steps must use exactly these weights"
and "A state it cannot load at all (a rank above its ``max_lora_rank``, say) is refused the same way" / driver.py,
HostConfig: "``client_adapters`` maps adapter names clients may use to PEFT folders."

Bug: the rank check of the LoRA loader is off by one: ``rank >= max_lora_rank`` raises "rank too large", so a rank
equal to the configured maximum (the slot size) is refused for the fine-tuning adapter, published versions and
client adapters alike (a host started with such a client adapter does not start). Ranks below the limit are exact.
Trigger: an adapter of rank exactly max_lora_rank: r 16 with the default max_lora_rank 16 (one of the most common
LoRA ranks).
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
from deltaserve_core.hostkit import published_name  # noqa: F401
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
    """rank_limit_off_by_one: see the module docstring."""

    def _to_lora(self, state: LoraAdapterState) -> _Lora:
        pairs: dict[tuple[int, str], tuple[torch.Tensor, torch.Tensor]] = {}
        for key, tensor in state.tensors.items():
            layer, module, ab = parse_peft_key(key)
            if ab != "A":
                continue
            b = state.tensors[key[: -len("A.weight")] + "B.weight"]
            if tensor.shape[0] >= self.config.max_lora_rank:  # BUG: a rank equal to the limit is refused
                raise ValueError(f"adapter {state.name!r} has rank {tensor.shape[0]} > max_lora_rank="
                                 f"{self.config.max_lora_rank}; raise HostConfig.max_lora_rank")
            # Copies: the core may keep training the tensors it handed over; the host serves this snapshot.
            pairs[(layer, module)] = (tensor.detach().to(self.device, self.dtype, copy=True),
                                      b.detach().to(self.device, self.dtype, copy=True))
        return _Lora(state.config.scaling, pairs)
