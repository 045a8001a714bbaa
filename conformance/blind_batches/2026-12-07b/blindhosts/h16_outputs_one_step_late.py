"""step() returns the requests that finished in the previous step (one-step-late output processing).

Rule: driver.py, HostDriver.step: "Run at most one engine step (or, for engines with their own loop, wait for the
next one); return the requests that finished in it."

Bug: async output processing: each iteration hands back the outputs the previous iteration produced while the
current step's outputs wait in a pending slot (has_unfinished() counts it, so loops still end and generate() is
right). A request finishing in step N is returned by the step() call of step N+1 (an empty iteration when nothing
else runs).
Trigger: every request driven with step() (a server loop, timed traces).
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
    RequestSLO,
    ScheduledRequest,
    StepRecord,
)


class Host(ReferenceHost):
    """outputs_one_step_late: see the module docstring."""

    _pending_out: list = []

    def step(self) -> list[ClientOutput]:
        outputs = self._step(allow_idle=False)
        outputs, self._pending_out = self._pending_out, outputs  # BUG: the previous iteration's outputs
        return take_kept(self._kept) + outputs

    def has_unfinished(self) -> bool:
        return bool(self._waiting or self._running or self._kept or self._pending_out)
