"""The scheduler admits a prompt only if it is strictly shorter than the step's remaining token budget.

Rule: driver.py, HostDriver.generate: "Submit ``requests`` (all arrive now) and run the engine until every one has
finished." / ClientRequest: "A greedy generation request: ``max_tokens`` new tokens after ``prompt_ids``."

Bug: the budget test is ``num_new_tokens < token_budget`` where submit's admission check is ``<=``: a prompt of
exactly max_batch_tokens tokens is accepted by submit and then never fits any step: it waits forever (step() keeps
returning nothing while has_unfinished() stays True). A prompt exactly filling what is left of a step's budget
only waits one step more.
Trigger: a prompt of exactly max_batch_tokens tokens (2048 by default): clients that truncate prompts to the
engine's limit send exactly that.
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
    """budget_fit_strict: see the module docstring."""

    def _schedule(self) -> tuple[list[_Seq], list[_Seq], list[_Seq]]:
        """Pick (prefills, decodes, left waiting). Mixed hosts take both; otherwise prefill steps come first."""
        budget = self.config.max_batch_tokens
        decodes = list(self._running)
        if not self.mixed and self._waiting and len(decodes) < self.config.max_running_requests:
            decodes = []
        budget -= len(decodes)
        prefills: list[_Seq] = []
        with self._lock:
            while (self._waiting and len(self._running) + len(prefills) < self.config.max_running_requests
                   and len(self._waiting[0].request.prompt_ids) < budget):  # BUG: strict
                seq = self._waiting.popleft()
                budget -= len(seq.request.prompt_ids)
                prefills.append(seq)
            left = list(self._waiting)
        if not self.mixed and prefills:
            decodes = []
        return prefills, decodes, left
