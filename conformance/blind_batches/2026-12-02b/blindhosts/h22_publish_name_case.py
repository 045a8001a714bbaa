"""Broken host h22: published adapters are registered under a lower-cased key.

Rule (hooks.py, HostHooks.publish_adapter): "Make trained weights servable to clients; returns the client-visible
adapter name."
Bug: the adapter registry is keyed case-insensitively (name.lower()) on publish, but the returned name keeps the
job's spelling and client lookups are exact, so a job named with capitals publishes a name clients cannot use.
Trigger: an adapter name with upper-case letters."""

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
    """Registers published versions under name.lower() but returns the original spelling."""

    name = "blind-h22"

    def publish_adapter(self, state: LoraAdapterState) -> str:
        name = f"{state.name}@v{state.version}"
        self._adapters[name.lower()] = self._to_lora(state)
        return name
