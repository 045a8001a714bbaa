"""A retracted version's weights are freed once no *running* request uses it; queued requests on it run on the base.

Rule: hooks.py, HostHooks.retract_adapter: "Requests submitted on it before the call (running or queued) finish on
its weights, never failed or moved to another adapter"

Bug: the release check looks at the running batch only (vLLM-style: the LoRA manager pins adapters of scheduled
requests), so a version retracted while requests on it still wait in the queue is freed at once; when those
requests are scheduled their adapter id maps to no slot and, as in the engines' punica mapping (index -1), their
rows run without LoRA.
Trigger: the core retracts the oldest version right after a publish while requests on it are queued (not yet
admitted): any load where requests wait.
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
    """retract_releases_queued: see the module docstring."""

    def _forget_withdrawn(self) -> None:
        self._withdrawn.release([s.request for s in self._running])  # BUG: queued requests do not pin a version

    def _linear(self, x: torch.Tensor, module: torch.nn.Module, layer: int, name: str,
                groups: dict[str, torch.Tensor]) -> torch.Tensor:
        out = module(x)
        for adapter, index in groups.items():
            try:
                lora = self._adapters.get(adapter) or self._withdrawn[adapter]
            except KeyError:  # an adapter id no slot holds: no LoRA for these rows (punica index -1)
                continue
            pair = lora.pairs.get((layer, name))
            if pair is None:
                continue
            a, b = pair
            # Same order of operations as PEFT's LoRA layer: B(A(x)) * scaling, added to the base output.
            out.index_add_(0, index, (x.index_select(0, index) @ a.T @ b.T) * lora.scaling)
        return out
