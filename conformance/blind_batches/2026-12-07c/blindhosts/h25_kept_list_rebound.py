"""step() hands out the kept outputs by rebinding ``self._kept`` to a new list: generate() keeps appending to the old
one.

Rule: driver.py, HostDriver.generate: "Requests submitted earlier with ``submit`` that finish while it runs are not
its own: their outputs are never lost and never in its result, the next ``step()`` returns them" / HostDriver.step:
"It also returns, exactly once, the outputs of other requests that finished during an earlier ``generate()`` call"

Bug: ``kept, self._kept = self._kept, []`` instead of emptying the list in place (take_kept): generate() was handed
the list object at its start and appends other requests' outputs to it, which no later step() looks at (and
has_unfinished() no longer counts). The outputs of submit()ted requests that finish inside a generate() call are
lost.
Trigger: generate() called while a submit()ted request is in flight and finishes during it (a server's traffic and
a test's generate() sharing one engine).
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
from deltaserve_core.hostkit import published_name  # noqa: F401
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
    """kept_list_rebound: see the module docstring."""

    def step(self) -> list[ClientOutput]:
        outputs = self._step(allow_idle=False)
        kept, self._kept = self._kept, []  # BUG: rebinds the attribute instead of emptying the list
        return kept + outputs
