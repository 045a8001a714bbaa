"""Broken host h17: profile decode rows get their context rounded down to whole KV blocks.

Rule (hooks.py, HostHooks.run_profile_step): "Execute one synthetic step of ``shape`` through the host's normal
path and return its record." (types.py ProfileShape: "a decode batch with its KV length").
Bug: the throw-away decode requests are given as many KV blocks of 16 tokens as fit in ``decode_context``,
so a context that is not a multiple of 16 runs (and is reported) shorter than asked.
Trigger: ``run_profile_step`` with ``decode_context % 16 != 0``."""

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
    """Rounds ProfileShape.decode_context down to a multiple of 16."""

    name = "blind-h17"

    _BLOCK = 16

    def run_profile_step(self, shape: ProfileShape) -> StepRecord:
        if shape.num_decode and shape.decode_context % self._BLOCK:
            shape = dataclasses.replace(shape, decode_context=(shape.decode_context // self._BLOCK) * self._BLOCK)
        return super().run_profile_step(shape)
