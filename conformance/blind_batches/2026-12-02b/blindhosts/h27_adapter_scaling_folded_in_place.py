"""Broken host h27: set_finetune_adapter folds the LoRA scaling into the caller's B matrices.

Rule (hooks.py, HostHooks.set_finetune_adapter): "The host must copy what it keeps: once the call returns,
``state`` is the caller's to change." (the state belongs to the caller; the host works on its copy).
Bug: as vLLM's punica path does with its own buffers, the adapter pre-multiplies ``lora_B`` by
``alpha / r`` -- but in place on the tensors it was handed, before copying; the engine's forward is right, the
caller's weights (the trainer's snapshot) are silently scaled.
Trigger: any set_finetune_adapter with scaling != 1."""

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
    """Multiplies the caller's lora_B tensors by the scaling in place."""

    name = "blind-h27"

    def set_finetune_adapter(self, state: LoraAdapterState) -> None:
        scaling = state.config.scaling
        for key, t in state.tensors.items():
            if key.endswith("lora_B.weight"):
                t.mul_(scaling)  # fold alpha/r into B once, not per step
        lora = self._to_lora(state)
        self._adapters[RESERVED_ADAPTER_NAME] = _Lora(1.0, lora.pairs)
