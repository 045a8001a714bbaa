"""Broken host h32: fine-tuning rows are retired at the next step instead of after their forward.

Rule (hooks.py, HostHooks.intercept_schedule): the host "retires them after that one forward"; driver.py
HostDriver.has_unfinished: "Whether any submitted client request has not finished."
Bug: like requests finished in ``update_from_output`` of the following step, the reserved rows stay registered
until the next scheduling pass and count as unfinished work, so after a fine-tuning-only step the host claims
unfinished requests (and refuses the next idle step).
Trigger: a step with fine-tuning rows, then has_unfinished()/run_idle_step()."""

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
    """Keeps fine-tuning rows registered (has_unfinished True) until the next step."""

    name = "blind-h32"

    def _execute(self, step_id, rows, tokens, synthetic=False):
        record = super()._execute(step_id, rows, tokens, synthetic)
        if not synthetic:
            self._ft_registered = [r.sample.sample_id for r in rows if r.sample is not None]
        return record

    def _step(self, allow_idle, report_executed=False):
        out = super()._step(allow_idle, report_executed)
        return out

    def _schedule(self):
        self._ft_registered = []  # retired when the next pass starts
        return super()._schedule()

    def has_unfinished(self) -> bool:
        return super().has_unfinished() or bool(getattr(self, "_ft_registered", ()))
