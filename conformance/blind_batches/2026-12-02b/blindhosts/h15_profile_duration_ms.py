"""Broken host h15: profile steps report their duration in milliseconds.

Rule (types.py module docstring): "Time is always ``time.monotonic()`` seconds of the process that schedules;
durations are seconds." and StepRecord: "``duration_s`` is the device-complete wall time of the forward step".
Bug: calibration steps are timed with device events whose ``elapsed_time()`` is in ms and the adapter forgets the
/1000 there (normal steps are timed with monotonic and are right).
Trigger: ``run_profile_step``."""

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
    """run_profile_step records duration_s in milliseconds (returned and sent to the sink)."""

    name = "blind-h15"

    def run_profile_step(self, shape: ProfileShape) -> StepRecord:
        sink = self._step_sink
        self._step_sink = None
        try:
            record = super().run_profile_step(shape)
        finally:
            self._step_sink = sink
        record = dataclasses.replace(record, duration_s=record.duration_s * 1000.0)  # event.elapsed_time()
        if sink is not None:
            sink(record)
        return record
