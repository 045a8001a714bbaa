"""Broken host: ``ProposedBatch.waiting`` is a snapshot of the queue taken before this step's admissions.

Rule (types.py, ProposedBatch): "A request is in at most one of the two, never in both: a decode running in this step
is ``scheduled`` only."

Bug: the scheduler patch copies the waiting queue at the top of ``schedule()`` (to price the queued requests' TTFT
clocks) and reuses that copy as ``waiting`` after the scheduler admitted new prefills from it: every request admitted
in this step is in ``scheduled`` and in ``waiting``, counted twice by the core's admission pricing.

Trigger: every step that admits a prefill.
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



class Host(ReferenceHost):
    def _schedule(self) -> tuple[list[_Seq], list[_Seq], list[_Seq]]:
        """Pick (prefills, decodes, left waiting). Mixed hosts take both; otherwise prefill steps come first."""
        budget = self.config.max_batch_tokens
        decodes = list(self._running)
        if not self.mixed and self._waiting and len(decodes) < self.config.max_running_requests:
            decodes = []
        budget -= len(decodes)
        prefills: list[_Seq] = []
        with self._lock:
            queued = list(self._waiting)  # BUG: snapshot before admission, used as `waiting` below
            while (self._waiting and len(self._running) + len(prefills) < self.config.max_running_requests
                   and len(self._waiting[0].request.prompt_ids) <= budget):
                seq = self._waiting.popleft()
                budget -= len(seq.request.prompt_ids)
                prefills.append(seq)
            left = queued
        if not self.mixed and prefills:
            decodes = []
        return prefills, decodes, left
