"""retract_adapter aborts the queued (not yet admitted) requests that name the retracted version.

Rule: hooks.py, HostHooks.retract_adapter: "Requests submitted on it before the call (running or queued) finish on
its weights, never failed or moved to another adapter"

Bug: the unload path pins the adapter for running requests only and aborts the waiting requests that name it (the
engine's "abort requests of a removed LoRA" clean-up), so they are never served: no output ever comes back for them
and has_unfinished() forgets them. Requests already running finish on the version's weights (exact).
Trigger: the core retracts the oldest version right after a publish while requests on it are queued (not yet
admitted): any load where requests wait, or a request submitted just before the prune and the next step.
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
    """retract_drops_queued: see the module docstring."""

    def retract_adapter(self, name: str) -> None:
        """Stop serving published version ``name`` (the core prunes old versions): refused from now on, its weights
        kept until the last request submitted on it before has finished."""
        lora = self._adapters.pop(name, None)
        with self._lock:  # BUG: queued requests on the removed adapter are aborted
            for s in [s for s in self._waiting if s.request.adapter == name]:
                self._waiting.remove(s)
        if lora is not None:
            self._withdrawn.hold(name, lora)
            self._forget_withdrawn()
