"""Broken host h21: every publish replaces the weights under one stable client name.

Rule (hooks.py, HostHooks.publish_adapter): "A host must never serve KV computed with older weights under the
returned name (publish under a fresh name/version or reset its prefix cache)."
Bug: to give clients "the latest adapter" under one name, the weights behind ``state.name`` are swapped in place;
requests already decoding on that name keep their KV from the old weights and continue with the new ones.
Trigger: a publish while a request on the published name is decoding."""

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
    """publish_adapter returns state.name and swaps its weights in place."""

    name = "blind-h21"

    def publish_adapter(self, state: LoraAdapterState) -> str:
        self._adapters[state.name] = self._to_lora(state)
        return state.name
