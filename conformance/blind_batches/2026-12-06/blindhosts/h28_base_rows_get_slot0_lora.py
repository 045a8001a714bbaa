"""Broken host: rows without an adapter get the LoRA of slot 0 when their step uses any LoRA.

Rule (driver.py, ClientRequest): "A greedy generation request: ``max_tokens`` new tokens after ``prompt_ids``." (on the
base model when ``adapter`` is None; HostConfig: "``client_adapters`` maps adapter names clients may use").

Bug: SGLang-style LoRA batching: each row's weight index comes from a per-step table of the adapters it uses, and
rows without an adapter were meant to get a zero "no LoRA" slot; the adapter fills the engine's slots from index 0
with the loaded adapters (in load order) and maps ``None`` to 0. Whenever a step carries any LoRA row (a client
adapter, or fine-tuning rows on the reserved adapter), base-model rows of that step are computed with the first
loaded adapter. Steps with base rows only are right.

Trigger: base-model requests sharing a step with requests on a client adapter, or with fine-tuning rows.
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
    def _linear(self, x, module, layer, name, groups):
        out = super()._linear(x, module, layer, name, groups)
        if not groups:
            return out  # a step without LoRA rows runs the plain base kernel
        base = torch.ones(x.shape[0], dtype=torch.bool, device=x.device)
        for index in groups.values():
            base[index] = False
        rows = base.nonzero().flatten()
        slot0 = next(iter(self._adapters))  # BUG: "no adapter" maps to slot 0, which holds the first loaded adapter
        pair = self._adapters[slot0].pairs.get((layer, name))
        if pair is not None and len(rows):
            a, b = pair
            out.index_add_(0, rows, (x.index_select(0, rows) @ a.T @ b.T) * self._adapters[slot0].scaling)
        return out
