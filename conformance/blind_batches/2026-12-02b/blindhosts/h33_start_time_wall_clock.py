"""Broken host h33: ``StepRecord.start_time`` is wall-clock time.

Rule (types.py module docstring): "Time is always ``time.monotonic()`` seconds of the process that schedules".
Bug: the adapter stamps step starts with ``time.time()`` (what vLLM uses for request arrival), so records cannot be
compared with ``ProposedBatch.now`` or arrival times.
Trigger: every step."""

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
    """start_time taken from time.time()."""

    name = "blind-h33"

    def _execute(self, step_id, rows, tokens, synthetic=False):
        sink = self._step_sink
        held: list[StepRecord] = []
        self._step_sink = held.append if sink is not None else None
        try:
            record = super()._execute(step_id, rows, tokens, synthetic)
        finally:
            self._step_sink = sink
        record = dataclasses.replace(record, start_time=time.time() - record.duration_s)
        if sink is not None:
            sink(record)
        return record
