"""Broken host h19: set_finetune_adapter skips the upload when the version was already loaded.

Rule (hooks.py, HostHooks.set_finetune_adapter): "Fine-tuning rows of later steps must use exactly these weights
(the training path is only exact if the forward sees the current adapter)."
Bug: like vLLM's LoRA manager (``add_lora`` is a no-op for a known ``lora_int_id``) the adapter keys the reserved
slot by ``(name, version)``; after a restart rewinds the job, the same version number comes again with other
weights and the old ones keep running.
Trigger: two calls with the same name and version and different tensors."""

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
    """Ignores a set_finetune_adapter whose (name, version) equals the loaded one."""

    name = "blind-h19"

    def set_finetune_adapter(self, state: LoraAdapterState) -> None:
        key = (state.name, state.version)
        if getattr(self, "_ft_key", None) == key and RESERVED_ADAPTER_NAME in self._adapters:
            return  # already resident
        super().set_finetune_adapter(state)
        self._ft_key = key
