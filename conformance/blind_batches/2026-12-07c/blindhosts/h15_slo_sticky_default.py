"""A request without an SLO is offered with the SLO of the last request that had one.

Rule: types.py, ScheduledRequest: "``slo`` must be the client request's own ``ClientRequest.slo``, exactly as
submitted (``None`` only when the client gave none)"

Bug: the adapter carries the SLO in the engine's per-request extra args by writing it into a dict of defaults the
adapter shares between requests (``defaults.update(slo=...)`` when a request has one) and building each request's
args from that dict: once any request gave an SLO, later requests without one inherit it.
Trigger: a request without an SLO submitted after any request with one (mixed clients: interactive requests with
SLOs and batch requests without).
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
    """slo_sticky_default: see the module docstring."""

    def _enqueue(self, request: ClientRequest) -> None:
        """Queue an admitted request and tell the core it arrived (``submit`` after its checks)."""
        now = time.monotonic()
        with self._lock:
            defaults = self.__dict__.setdefault("_default_args", {})  # BUG: SLO written into shared defaults
            if request.slo is not None:
                defaults["slo"] = request.slo
            self._waiting.append(_Seq(dataclasses.replace(request, slo=defaults.get("slo")), now))
        if self._interceptor is not None:
            self._interceptor.on_arrival(request.request_id, now)
