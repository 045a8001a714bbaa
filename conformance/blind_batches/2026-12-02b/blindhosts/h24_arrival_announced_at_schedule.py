"""Broken host h24: ``on_arrival`` is called when the scheduler first sees a request, not when it arrives.

Rule (hooks.py, ScheduleInterceptor.on_arrival): "Called by: the host, from whichever thread accepts requests (it
may run while a step executes), once per client request. The core uses it to abort a running fine-tuning-only step
so the new request is not delayed by more than one layer."
Bug: arrivals are announced from the scheduler loop at the start of the next step, so a request submitted during
a fine-tuning-only step cannot abort it (it waits the whole step).
Trigger: a request submitted while no step is being formed (e.g. during a fine-tuning-only step)."""

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
    """Defers on_arrival to the start of the next scheduler step."""

    name = "blind-h24"

    def _enqueue(self, request: ClientRequest) -> None:
        now = time.monotonic()
        with self._lock:
            self._waiting.append(_Seq(request, now))
            self.__dict__.setdefault("_unannounced", []).append((request.request_id, now))

    def _step(self, allow_idle, report_executed=False):
        with self._lock:
            news, self._unannounced = self.__dict__.get("_unannounced", []), []
        if self._interceptor is not None:
            for rid, t in news:
                self._interceptor.on_arrival(rid, t)
        return super()._step(allow_idle, report_executed)
