"""step() hands out the outputs kept from a generate() call only together with outputs of its own.

Rule: driver.py, HostDriver.step: "It also returns, exactly once, the outputs of other requests that finished during
an earlier ``generate()`` call (see there) and no call returned yet."

Bug: an early return for iterations that finished nothing (``if not outputs: return []``) sits before the merge of
the kept outputs. has_unfinished() counts them (they are kept), so a loop stepping while has_unfinished() spins until
some other request finishes; with nothing else running they are never returned.
Trigger: generate() called while a submit()ted request runs and that request finishes inside it, then step() calls
with no other request finishing (a server's traffic and a test's generate sharing one engine).
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
    """kept_outputs_only_with_new_ones: see the module docstring."""

    def step(self) -> list[ClientOutput]:
        outputs = self._step(allow_idle=False)
        if not outputs:  # BUG: early return before the kept outputs are merged
            return []
        return take_kept(self._kept) + outputs
