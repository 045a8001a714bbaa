"""Broken host: ``ScheduledRequest.output_tokens`` lags one token behind.

Rule (types.py, ScheduledRequest): "``output_tokens`` counts tokens generated so far."

Bug: the scheduler patch derives the output count from the engine's computed-token counter
(``num_computed_tokens - num_prompt_tokens``); the last sampled token is not computed into the KV cache until the
next decode, so the count is one short for every request that has produced a token (0 after the first token, k-1
after k). The core's average-TPOT budget divides by it.

Trigger: every decode view (any request with max_tokens >= 2).
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


class _ComputedSeq(_Seq):
    def view(self, prefill: bool):
        v = super().view(prefill)
        computed = self.context  # tokens whose KV exists: prompt + outputs - 1 once decoding
        return replace(v, output_tokens=max(0, computed - len(self.request.prompt_ids)))  # BUG



class Host(ReferenceHost):
    def _enqueue(self, request) -> None:
        now = time.monotonic()
        with self._lock:
            self._waiting.append(_ComputedSeq(request, now))
        if self._interceptor is not None:
            self._interceptor.on_arrival(request.request_id, now)
