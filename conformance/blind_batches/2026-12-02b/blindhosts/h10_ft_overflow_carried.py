"""Broken host h10: samples that do not fit the step's token budget are carried to the next step.

Rule (hooks.py, HostHooks.intercept_schedule): "Samples the step cannot take are refused in that step's record
(``aborted_sample_ids``), never carried to a later step."
Bug: the adapter fits the returned samples into what is left of ``max_batch_tokens`` after the client rows and
queues the rest for the next step's plan, as a scheduler does with a waiting queue.
Trigger: client rows + fine-tuning tokens over ``max_batch_tokens`` in one step."""

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
    """Carries over-budget samples to the next step instead of refusing them."""

    name = "blind-h10"

    def intercept_schedule(self, interceptor):
        if interceptor is None:
            self._interceptor = None
            return
        host = self
        host._carry = []

        class _Fit:
            def on_schedule(self, batch):
                offered = list(host._carry) + list(interceptor.on_schedule(batch))
                budget = host.config.max_batch_tokens - sum(batch.prefill_lengths) - batch.num_decode
                take, host._carry = [], []
                for s in offered:
                    if s.num_tokens <= budget:
                        take.append(s)
                        budget -= s.num_tokens
                    else:
                        host._carry.append(s)  # next step will have room
                return take

            def on_arrival(self, request_id, arrival_time):
                interceptor.on_arrival(request_id, arrival_time)

        self._interceptor = _Fit()
