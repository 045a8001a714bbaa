"""Broken host h26: when the samples do not fit, the interceptor is asked a second time for the same step.

Rule (hooks.py, ScheduleInterceptor.on_schedule): "exactly once per step"; (HostHooks.intercept_schedule: "Samples
the step cannot take are refused in that step's record (``aborted_sample_ids``)").
Bug: samples over the step's remaining token budget are refused (correctly reported as aborted), but the adapter
then calls ``on_schedule`` again with the same batch hoping for a smaller set.
Trigger: client rows + fine-tuning tokens over ``max_batch_tokens``."""

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
    """Calls on_schedule a second time for a step whose first answer did not fit."""

    name = "blind-h26"

    def intercept_schedule(self, interceptor):
        if interceptor is None:
            self._interceptor = None
            return
        host = self
        host._refused = []

        class _Retry:
            def on_schedule(self, batch):
                budget = host.config.max_batch_tokens - sum(batch.prefill_lengths) - batch.num_decode
                samples = list(interceptor.on_schedule(batch))
                if sum(s.num_tokens for s in samples) > budget:
                    host._refused.extend(s.sample_id for s in samples)
                    samples = [s for s in interceptor.on_schedule(batch)]  # ask again: maybe smaller now
                    if sum(s.num_tokens for s in samples) > budget:
                        host._refused.extend(s.sample_id for s in samples)
                        samples = []
                return samples

            def on_arrival(self, request_id, arrival_time):
                interceptor.on_arrival(request_id, arrival_time)

        self._interceptor = _Retry()

    def _execute(self, step_id, rows, tokens, synthetic=False):
        sink = self._step_sink
        held: list[StepRecord] = []
        self._step_sink = held.append if sink is not None else None
        try:
            record = super()._execute(step_id, rows, tokens, synthetic)
        finally:
            self._step_sink = sink
        refused, self._refused = tuple(getattr(self, "_refused", ())), []
        if refused:
            record = dataclasses.replace(record, aborted_sample_ids=record.aborted_sample_ids + refused)
        if sink is not None:
            sink(record)
        return record
