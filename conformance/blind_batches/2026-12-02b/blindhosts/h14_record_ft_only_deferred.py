"""Broken host h14: the record of a fine-tuning-only step is delivered after the next step's record.

Rule (hooks.py, HostHooks.report_step_time): "exactly one :class:`StepRecord` per executed step, in step order".
Bug: fine-tuning-only steps are timed with a deferred device timer that is resolved when the *next* step
completes; the adapter pushes the next step's record first, then the deferred one.
Trigger: a fine-tuning-only step (``run_idle_step``) followed by any other step."""

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
    """Holds fine-tuning-only records back and delivers them after the following step's record."""

    name = "blind-h14"

    def _execute(self, step_id, rows, tokens, synthetic=False):
        sink = self._step_sink
        held: list[StepRecord] = []
        self._step_sink = held.append if sink is not None else None
        try:
            record = super()._execute(step_id, rows, tokens, synthetic)
        finally:
            self._step_sink = sink
        if sink is None:
            return record
        pending = self.__dict__.setdefault("_deferred_records", [])
        if rows and all(r.sample is not None for r in rows) and not synthetic:
            pending.append(record)  # device timer resolved at the next step
        else:
            sink(record)
            while pending:
                sink(pending.pop(0))
        return record
