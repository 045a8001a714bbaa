"""Broken host: ``ScheduledRequest.context_tokens`` is the KV capacity of the request's blocks.

Rule (types.py, ScheduledRequest): "``context_tokens`` is the KV-cache length the request attends over *before* this
step."

Bug: the scheduler patch reads the context from the request's block table (``len(block_ids) * block_size``, 16-token
blocks) instead of its computed-token count, so every decode's context is rounded up to a whole block: the core's
KV term (``ProposedBatch.kv_tokens``) is inflated by up to 15 tokens per decode.

Trigger: any decode whose context is not a multiple of 16 (almost every decode).
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


BLOCK_SIZE = 16


class _PagedSeq(_Seq):
    def view(self, prefill: bool):
        v = super().view(prefill)
        blocks = -(-self.context // BLOCK_SIZE)
        return replace(v, context_tokens=blocks * BLOCK_SIZE)  # BUG: block-table capacity, not tokens computed



class Host(ReferenceHost):
    def _enqueue(self, request) -> None:
        now = time.monotonic()
        with self._lock:
            self._waiting.append(_PagedSeq(request, now))
        if self._interceptor is not None:
            self._interceptor.on_arrival(request.request_id, now)
