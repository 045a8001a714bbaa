"""retract_adapter only queues the unload for the engine loop; until the next step the name is still accepted.

Rule: hooks.py, HostHooks.retract_adapter: "Afterwards a request naming ``name`` is refused by ``submit`` exactly as
one naming an adapter the host never loaded"

Bug: like an adapter that forwards ``remove_lora`` to the engine core's input queue, retract_adapter records the name
and the engine loop withdraws it at the start of its next step; ``submit`` in between accepts the withdrawn name
(and the request is then served on the withdrawn version, as one submitted before the retraction).
Trigger: a request for the retracted version that arrives between the core's prune (right after a publish) and the
next engine step: clients of the oldest version keep sending.
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
    """retract_deferred_to_step: see the module docstring."""

    def retract_adapter(self, name: str) -> None:
        self.__dict__.setdefault("_pending_retract", []).append(name)  # BUG: applied by the engine loop's next step

    def _step(self, allow_idle: bool, report_executed: bool = False):  # noqa: ANN202
        pending = self.__dict__.setdefault("_pending_retract", [])
        while pending:
            ReferenceHost.retract_adapter(self, pending.pop(0))
        return ReferenceHost._step(self, allow_idle, report_executed)
