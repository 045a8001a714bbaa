"""Broken host h11: ``graph_mode`` predicts CUDA-graph replay for small uniform decode batches that run eagerly.

Rule (hooks.py, HostHooks.graph_mode): "Must be a pure function of the batch's shape and the host's configuration,
and agree with the ``mode`` of the step's :class:`StepRecord` whenever no fine-tuning rows were added."
Bug: the prediction is ported from vLLM's FULL_DECODE_ONLY logic (uniform decode with batch size in the capture
sizes -> GRAPH) without checking enforce_eager; the engine runs every step eagerly and records EAGER.
Trigger: a pure-decode step of 1..8 requests."""

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
    """graph_mode says GRAPH for uniform decode batches of <= 8 while the step runs (and records) EAGER."""

    name = "blind-h11"

    _CAPTURE_SIZES = (1, 2, 4, 8)

    def graph_mode(self, batch: ProposedBatch) -> ExecutionMode:
        n = len(batch.scheduled)
        if n and all(r.prefill_tokens == 0 for r in batch.scheduled):
            padded = next((s for s in self._CAPTURE_SIZES if s >= n), None)
            if padded is not None:
                return ExecutionMode.GRAPH
        return ExecutionMode.EAGER
