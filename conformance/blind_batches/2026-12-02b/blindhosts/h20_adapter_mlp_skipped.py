"""Broken host h20: LoRA on MLP projections is silently dropped.

Rule (hooks.py, HostHooks.set_finetune_adapter): "A host that cannot apply every target module of ``state`` must
refuse it by raising, never run with part of it."
Bug: the engine's LoRA kernels cover only the attention projections; the adapter logs a warning and loads the
attention part of the state.
Trigger: a state targeting gate_proj/up_proj/down_proj."""

from __future__ import annotations

import dataclasses
import logging
import threading
import time
from collections import deque
from collections.abc import Sequence

import torch

from deltaserve_core.adapter_state import LoraAdapterState, parse_peft_key
from deltaserve_core.driver import ClientOutput, ClientRequest, check_client_adapter
from deltaserve_core.hooks import RESERVED_ADAPTER_NAME, ActivationSink, ReservedAdapterError, ScheduleInterceptor, StepSink
from deltaserve_core.testing.reference_host import ReferenceHost, _Lora, _Row, _Seq
from deltaserve_core.types import (
    ExecutionMode,
    FineTuneSample,
    HostCapabilities,
    ProfileShape,
    ProposedBatch,
    StepRecord,
)

log = logging.getLogger(__name__)


class Host(ReferenceHost):
    """Skips non-attention target modules with a warning instead of raising."""

    name = "blind-h20"

    def _to_lora(self, state: LoraAdapterState) -> _Lora:
        pairs: dict[tuple[int, str], tuple[torch.Tensor, torch.Tensor]] = {}
        for key, tensor in state.tensors.items():
            layer, module, ab = parse_peft_key(key)
            if not module.startswith("self_attn."):
                log.warning("LoRA on %s is not supported by this engine's kernels; skipped", module)
                continue
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
