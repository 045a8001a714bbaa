"""Broken host h34: ``intercept_schedule(None)`` leaves the old interceptor installed.

Rule (hooks.py, HostHooks.intercept_schedule): "Install (or with ``None`` remove) the core's admission callback.
... A later call replaces the installed interceptor, which is never called again."
Bug: a defensive ``if interceptor is not None`` guard (the adapter author feared a half-started core passing None)
makes removal a no-op; the stopped core keeps getting on_schedule/on_arrival and can still inject rows.
Trigger: intercept_schedule(None) after an interceptor was installed."""

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
    """Ignores intercept_schedule(None)."""

    name = "blind-h34"

    def intercept_schedule(self, interceptor):
        if interceptor is not None:
            self._interceptor = interceptor
