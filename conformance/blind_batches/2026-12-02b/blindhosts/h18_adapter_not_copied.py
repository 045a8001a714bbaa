"""Broken host h18: adapter tensors are kept by reference when they already have the engine's dtype/device.

Rule (hooks.py, HostHooks.set_finetune_adapter): "The host must copy what it keeps: once the call returns,
``state`` is the caller's to change."
Bug: ``tensor.to(device, dtype)`` without ``copy=True`` returns the caller's tensor itself when nothing needs
converting (float32 on CPU), so later in-place optimizer updates leak into the engine between installs.
Trigger: the caller changes the state's tensors in place after the call (same dtype and device as the host)."""

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
    """Keeps the caller's adapter tensors (no copy when dtype/device already match)."""

    name = "blind-h18"

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
            pairs[(layer, module)] = (tensor.detach().to(self.device, self.dtype),
                                      b.detach().to(self.device, self.dtype))
        return _Lora(state.config.scaling, pairs)
