"""Broken host h28: capabilities() reports the token budget that is currently free.

Rule (hooks.py, HostHooks.capabilities): "What this host supports. Called at start-up; must be cheap and constant
for the host's lifetime."
Bug: ``max_finetune_tokens_per_step`` is computed from what the queued client prompts leave of
``max_batch_tokens`` (a "helpful" dynamic budget), so the answer changes as requests come and go.
Trigger: capabilities() called while client requests are queued or running."""

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
    """max_finetune_tokens_per_step shrinks with queued/running client tokens."""

    name = "blind-h28"

    def capabilities(self) -> HostCapabilities:
        used = sum(len(s.request.prompt_ids) for s in list(self._waiting)) + len(self._running)
        free = max(1, self.config.max_batch_tokens - used)
        return dataclasses.replace(self._capabilities, max_finetune_tokens_per_step=free)
