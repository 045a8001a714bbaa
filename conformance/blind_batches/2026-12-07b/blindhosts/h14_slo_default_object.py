"""A request submitted without an SLO is offered with ``RequestSLO()`` (all fields None) instead of None.

Rule: types.py, ScheduledRequest: "``slo`` must be the client request's own ``ClientRequest.slo``, exactly as
submitted (``None`` only when the client gave none)"

Bug: the SLO travels in the engine request's extra arguments as a dict and is rebuilt on the scheduler side as
``RequestSLO(**extra.get("slo") or {})``: a request with no SLO comes back with an empty RequestSLO object.
Requests with an SLO are exact.
Trigger: every request submitted without an SLO (the default of ClientRequest), in every batch it appears in.
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
    """slo_default_object: see the module docstring."""

    def _enqueue(self, request: ClientRequest) -> None:
        """Queue an admitted request and tell the core it arrived (``submit`` after its checks)."""
        now = time.monotonic()
        with self._lock:
            slo = RequestSLO(**({} if request.slo is None else {f: getattr(request.slo, f) for f in ("ttft_s", "tpot_s", "avg_tpot_s")}))
            self._waiting.append(_Seq(dataclasses.replace(request, slo=slo), now))  # BUG: None rebuilt as RequestSLO()
        if self._interceptor is not None:
            self._interceptor.on_arrival(request.request_id, now)
