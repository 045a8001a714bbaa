"""has_unfinished() asks the scheduler's queues only: outputs kept from a generate() call are not counted.

Rule: driver.py, HostDriver.has_unfinished: "Whether any submitted client request has not finished. [...] a request
is unfinished from ``submit`` until its output is returned"

Bug: has_unfinished() is ``bool(waiting or running)``; a submit()ted request that finished inside a generate() call
is held for the next step() (HostDriver.generate), but has_unfinished() already says False, so a caller that
steps ``while has_unfinished()`` (the core's serving loop, run_to_completion) never collects it.
Trigger: generate() called while a submit()ted request is running and that request finishes first (a server's
traffic and a test's generate sharing one engine).
"""
from __future__ import annotations

import dataclasses  # noqa: F401
import math  # noqa: F401
import time  # noqa: F401
from collections.abc import Sequence  # noqa: F401

import torch  # noqa: F401
import torch.nn.functional as F  # noqa: F401

from deltaserve_core.adapter_state import LoraAdapterState, parse_peft_key  # noqa: F401
from deltaserve_core.driver import ClientOutput, ClientRequest, check_client_adapter, take_kept  # noqa: F401
from deltaserve_core.hooks import RESERVED_ADAPTER_NAME  # noqa: F401
from deltaserve_core.hostkit import published_name  # noqa: F401
from deltaserve_core.testing.reference_host import ReferenceHost, _Lora, _Row, _Seq  # noqa: F401
from deltaserve_core.types import (  # noqa: F401
    ExecutionMode,
    FineTuneSample,
    ModelSpec,
    ProposedBatch,
    ScheduledRequest,
    StepRecord,
)


class Host(ReferenceHost):
    """has_unfinished_ignores_kept: see the module docstring."""

    def has_unfinished(self) -> bool:
        return bool(self._waiting or self._running)  # BUG: kept outputs not counted
