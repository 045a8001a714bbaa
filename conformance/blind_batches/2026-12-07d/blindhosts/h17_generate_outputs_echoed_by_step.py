"""generate()'s own outputs are also left for step(): the next step() returns them a second time.

Rule: driver.py, HostDriver.step: "It also returns, exactly once, the outputs of other requests that finished during an
earlier ``generate()`` call (see there) and no call returned yet." / HostDriver.has_unfinished: "it is False once every
client request has been returned"

Bug: the driver's result collector appends every finished output to the pending list that step() drains, and
generate() picks its own outputs out of the results without removing them from that list: after a generate() the
next step() returns them again (and has_unfinished() is True until it did). Traffic through submit()/step() only is
exact.
Trigger: a step() (or has_unfinished()) after any generate() call.
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
    """generate_outputs_echoed_by_step: see the module docstring."""

    def generate(self, requests: Sequence[ClientRequest]) -> list[ClientOutput]:
        outputs = run_to_completion(self, requests, self._kept)
        self._kept.extend(outputs)  # BUG: generate()'s own outputs stay in the pending list step() drains
        return outputs
