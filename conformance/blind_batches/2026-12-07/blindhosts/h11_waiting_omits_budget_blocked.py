"""The queued request that did not fit this step's token budget is missing from ProposedBatch.waiting.

Rule: types.py, ProposedBatch: "Every request that arrived and has not finished must be in ``scheduled`` or
``waiting`` (the core prices admission against all of them)."

Bug: the scheduler pops the head of the waiting queue to test it against the remaining token budget; a request that
does not fit is put back after ``waiting`` was snapshotted for the proposed batch, so the head-of-line request the
budget blocked is in neither ``scheduled`` nor ``waiting`` (the requests behind it are listed).
Trigger: prompts that together exceed ``max_batch_tokens`` (2048 by default) arriving together: e.g. four prompts of
600 tokens; the fourth waits for the next step and is invisible to the core in this one.
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
    """waiting_omits_budget_blocked: see the module docstring."""

    def _schedule(self) -> tuple[list[_Seq], list[_Seq], list[_Seq]]:
        """Pick (prefills, decodes, left waiting). Mixed hosts take both; otherwise prefill steps come first."""
        budget = self.config.max_batch_tokens
        decodes = list(self._running)
        if not self.mixed and self._waiting and len(decodes) < self.config.max_running_requests:
            decodes = []
        budget -= len(decodes)
        prefills: list[_Seq] = []
        blocked = None
        with self._lock:
            while self._waiting and len(self._running) + len(prefills) < self.config.max_running_requests:
                seq = self._waiting.popleft()
                if len(seq.request.prompt_ids) > budget:
                    blocked = seq
                    break
                budget -= len(seq.request.prompt_ids)
                prefills.append(seq)
            left = list(self._waiting)
            if blocked is not None:  # BUG: put back after the snapshot that becomes ProposedBatch.waiting
                self._waiting.appendleft(blocked)
        if not self.mixed and prefills:
            decodes = []
        return prefills, decodes, left
