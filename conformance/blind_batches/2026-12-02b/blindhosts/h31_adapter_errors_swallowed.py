"""Broken host h31: a refused adapter is logged and the previous one keeps running.

Rule (hooks.py, HostHooks.set_finetune_adapter): "A host that cannot apply every target module of ``state`` must
refuse it by raising, never run with part of it." (and "Fine-tuning rows of later steps must use exactly these
weights").
Bug: ``set_finetune_adapter`` wraps the load in ``try/except`` so a bad state cannot crash the engine; a state
the host cannot apply (rank above ``max_lora_rank``) is logged and the core is never told.
Trigger: a state with rank > max_lora_rank."""

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
    """Swallows the ValueError for an unloadable adapter."""

    name = "blind-h31"

    def set_finetune_adapter(self, state: LoraAdapterState) -> None:
        try:
            super().set_finetune_adapter(state)
        except Exception as e:  # never take the engine down for a bad adapter
            log.error("could not load fine-tuning adapter %s v%s: %s", state.name, state.version, e)
