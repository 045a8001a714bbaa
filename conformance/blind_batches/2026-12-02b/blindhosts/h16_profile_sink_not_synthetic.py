"""Broken host h16: the step sink receives profile steps with ``synthetic=False``.

Rule (hooks.py, HostHooks.run_profile_step): "The record is also delivered to the step sink with
``synthetic=True``."
Bug: the scheduler-side record builder does not know a step is a calibration step; only the record returned by
``run_profile_step`` is patched to ``synthetic=True``.
Trigger: ``run_profile_step`` with a step sink installed."""

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
    """Marks only the returned profile record synthetic, not the one sent to the step sink."""

    name = "blind-h16"

    def run_profile_step(self, shape: ProfileShape) -> StepRecord:
        sink = self._step_sink
        self._step_sink = None
        try:
            record = super().run_profile_step(shape)
        finally:
            self._step_sink = sink
        if sink is not None:
            sink(dataclasses.replace(record, synthetic=False))  # built by the scheduler from the plan
        return record
