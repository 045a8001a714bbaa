"""A request with no token yet is offered with last_token_time = its arrival time.

Rule: types.py, ScheduledRequest: "``first_token_time`` is set once the request has produced its first token;
``last_token_time`` is the time of its most recent token (for the TPOT budget)"

Bug: the engine's per-request stats initialise ``last_token_ts`` to the arrival time (vLLM's RequestStateStats
style) and the adapter copies it: every queued or prefilling request is offered with a last_token_time although it
has produced no token (first_token_time None), so the core starts its TPOT clock at arrival. Requests that have
tokens are right.
Trigger: every request, in the batch that prefills it and in every batch it waits in.
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


class _SeqStats(_Seq):
    """The engine's request with its stats-derived view."""

    def view(self, prefill: bool) -> ScheduledRequest:
        r = self.request
        return ScheduledRequest(
            request_id=r.request_id, arrival_time=self.arrival_time,
            prefill_tokens=len(r.prompt_ids) if prefill else 0, context_tokens=self.context,
            output_tokens=len(self.output), first_token_time=self.token_times[0] if self.token_times else None,
            last_token_time=self.token_times[-1] if self.token_times else self.arrival_time,  # BUG: stats default
            slo=r.slo,
        )


class Host(ReferenceHost):
    """last_token_time_arrival_default: see the module docstring."""

    def _enqueue(self, request: ClientRequest) -> None:
        """Queue an admitted request and tell the core it arrived (``submit`` after its checks)."""
        now = time.monotonic()
        with self._lock:
            self._waiting.append(_SeqStats(request, now))
        if self._interceptor is not None:
            self._interceptor.on_arrival(request.request_id, now)
