"""Published versions are scaled ``lora_alpha / sqrt(r)`` (rsLoRA) instead of ``lora_alpha / r``.

Rule: hooks.py, HostHooks.publish_adapter: "The returned name serves exactly ``state``'s weights until that name is
published again"

Bug: the publish path builds the engine's LoRA config from a template that sets ``use_rslora=True`` (the loader
then scales by ``alpha / sqrt(r)``), while the job's adapter is plain LoRA (LoraConfigSpec.scaling, PEFT's
``use_rslora=False``). The fine-tuning adapter and client adapters are exact.
Trigger: every publish of an adapter with r != 1 (r 8, alpha 16: 5.66 instead of 2).
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
    """publish_rslora_scaling: see the module docstring."""

    def publish_adapter(self, state: LoraAdapterState) -> str:
        # A fresh name per version: requests on an older version keep their KV, new ones never reuse it.
        name = published_name(state.name, state.version)
        lora = self._to_lora(state)
        rank = max(a.shape[0] for a, _ in lora.pairs.values())
        lora.scaling = state.config.lora_alpha / math.sqrt(rank)  # BUG: rsLoRA scaling from the engine's template
        self._adapters[name] = lora
        return name
