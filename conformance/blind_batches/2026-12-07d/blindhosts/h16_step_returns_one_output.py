"""step() returns at most one newly finished output; the others of that step come out of later calls.

Rule: driver.py, HostDriver.step: "Run at most one engine step (or, for engines with their own loop, wait for the next
one); return the requests that finished in it."

Bug: the driver reads one message per step from the engine's output queue (one ``recv`` per loop iteration, as a
detokenizer socket loop does); outputs of other requests that finished in the same step stay queued and are returned
by later step() calls (has_unfinished counts them; generate() collects them). Steps in which at most one request
finishes are exact.
Trigger: two requests finishing in the same step (requests submitted together with the same max_tokens).
"""
from __future__ import annotations

import dataclasses  # noqa: F401
import math  # noqa: F401
import time  # noqa: F401
from collections.abc import Sequence  # noqa: F401

import torch  # noqa: F401
import torch.nn.functional as F  # noqa: F401

from deltaserve_core.adapter_state import LoraAdapterState, parse_peft_key  # noqa: F401
from deltaserve_core.driver import ClientOutput, ClientRequest, check_client_adapter, run_to_completion, take_kept  # noqa: F401
from deltaserve_core.hooks import RESERVED_ADAPTER_NAME  # noqa: F401
from deltaserve_core.hostkit import profile_seed, published_name  # noqa: F401
from deltaserve_core.testing.reference_host import ReferenceHost, _as_list, _Lora, _Row, _Seq  # noqa: F401
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
    """step_returns_one_output: see the module docstring."""

    def step(self) -> list[ClientOutput]:
        outputs = self._step(allow_idle=False)
        kept = take_kept(self._kept)
        self._kept.extend(outputs[1:])  # BUG: one output per step from the output queue; the rest wait
        return kept + outputs[:1]
