"""Broken host h23: submit skips its checks for adapters that are already loaded.

Rule (hooks.py): "RESERVED_ADAPTER_NAME: LoRA adapter name under which fine-tuning rows run. Hosts must refuse
client requests naming it." (and intercept_schedule: fine-tuning rows "never" reach a client).
Bug: a fast path accepts any request whose adapter is resident; once ``set_finetune_adapter`` loaded the reserved
adapter, a client can generate with the training weights.
Trigger: a client request on the reserved name after set_finetune_adapter."""

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
    """submit accepts the reserved adapter once it is loaded."""

    name = "blind-h23"

    def submit(self, request: ClientRequest) -> None:
        if request.adapter is not None and request.adapter in self._adapters:
            self._enqueue(request)  # resident adapter: nothing to check
            return
        super().submit(request)
