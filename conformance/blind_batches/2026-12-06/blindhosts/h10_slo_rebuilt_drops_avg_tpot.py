"""Broken host: the request's SLO is rebuilt field by field and loses ``avg_tpot_s``.

Rule (types.py, ScheduledRequest): "``slo`` must be the client request's own ``ClientRequest.slo``, exactly as
submitted (``None`` only when the client gave none): the core budgets each request against it."

Bug: the engine request cannot carry DeltaServe objects, so the adapter stores the SLO in the engine's per-request
extra args as ``{"ttft_s": ..., "tpot_s": ...}`` (written against an earlier RequestSLO that had only those two fields)
and rebuilds ``RequestSLO(ttft_s=..., tpot_s=...)`` for the views: an average-TPOT objective is silently dropped.

Trigger: any client request whose SLO sets ``avg_tpot_s``.
"""
from __future__ import annotations

import time  # noqa: F401
from collections.abc import Sequence  # noqa: F401
from dataclasses import replace  # noqa: F401

import torch  # noqa: F401
import torch.nn.functional as F  # noqa: F401

from deltaserve_core.driver import ClientOutput  # noqa: F401
from deltaserve_core.hooks import RESERVED_ADAPTER_NAME  # noqa: F401
from deltaserve_core.testing.reference_host import ReferenceHost, _Lora, _Row, _Seq  # noqa: F401
from deltaserve_core.types import ExecutionMode, FineTuneSample, ProposedBatch, StepRecord  # noqa: F401
from deltaserve_core.types import RequestSLO


class _ExtraArgsSeq(_Seq):
    def view(self, prefill: bool):
        v = super().view(prefill)
        slo = self.request.slo
        extra = None if slo is None else {"ttft_s": slo.ttft_s, "tpot_s": slo.tpot_s}  # BUG: two fields only
        return replace(v, slo=None if extra is None else RequestSLO(**extra))



class Host(ReferenceHost):
    def _enqueue(self, request) -> None:
        now = time.monotonic()
        with self._lock:
            self._waiting.append(_ExtraArgsSeq(request, now))
        if self._interceptor is not None:
            self._interceptor.on_arrival(request.request_id, now)
