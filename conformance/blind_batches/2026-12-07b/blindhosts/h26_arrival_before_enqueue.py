"""on_arrival is called before the request is queued: during it, has_unfinished() does not count the request.

Rule: driver.py, HostDriver.has_unfinished: "a request is unfinished from ``submit`` until its output is returned" /
hooks.py, ScheduleInterceptor.on_arrival: "Tell the core a client request has entered the host."

Bug: the frontend notifies arrival listeners as soon as it has validated the request, before it hands the request to
the engine's input queue. A core that reacts to the arrival by asking whether client work is pending (to abort or
skip a fine-tuning-only step) is told there is none; after submit returns the request is counted (exact).
Trigger: every submit with an interceptor installed (each client request), observed from on_arrival.
"""
from __future__ import annotations

import dataclasses  # noqa: F401
import math  # noqa: F401
import time  # noqa: F401
from collections.abc import Sequence  # noqa: F401

import torch  # noqa: F401
import torch.nn.functional as F  # noqa: F401

from deltaserve_core.adapter_state import LoraAdapterState, parse_peft_key  # noqa: F401
from deltaserve_core.driver import ClientOutput, ClientRequest, check_client_adapter, take_kept  # noqa: F401
from deltaserve_core.hooks import RESERVED_ADAPTER_NAME  # noqa: F401
from deltaserve_core.hostkit import published_name  # noqa: F401
from deltaserve_core.testing.reference_host import ReferenceHost, _Lora, _Row, _Seq  # noqa: F401
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
    """arrival_before_enqueue: see the module docstring."""

    def _enqueue(self, request: ClientRequest) -> None:
        """Queue an admitted request and tell the core it arrived (``submit`` after its checks)."""
        now = time.monotonic()
        if self._interceptor is not None:  # BUG: listeners notified before the request is queued
            self._interceptor.on_arrival(request.request_id, now)
        with self._lock:
            self._waiting.append(_Seq(request, now))
