"""The reserved adapter slot keeps the LoRA scaling it was created with; later states replace only A and B.

Rule: hooks.py, HostHooks.set_finetune_adapter: "Fine-tuning rows of later steps must use exactly these weights
(the training path is only exact if the forward sees the current adapter)."

Bug: the engine allocates the reserved LoRA slot on the first set_finetune_adapter with that state's
``lora_alpha / r`` and afterwards copies new A/B tensors into it (the optimizer-step fast path), never the scaling.
Exact while every state has the first one's r and alpha (one job's optimizer steps).
Trigger: a second fine-tuning job on the running engine (or a job restarted with another rank or alpha): r 16 /
alpha 16 after r 8 / alpha 16 runs its rows at scaling 2 instead of 1.
"""
from __future__ import annotations

import dataclasses  # noqa: F401
import math  # noqa: F401
import time  # noqa: F401
from collections.abc import Sequence  # noqa: F401

import torch  # noqa: F401
import torch.nn.functional as F  # noqa: F401

from deltaserve_core.adapter_state import LoraAdapterState, parse_peft_key  # noqa: F401
from deltaserve_core.driver import ClientOutput, ClientRequest, check_client_adapter, run_to_completion, take_kept  # noqa: F401
from deltaserve_core.hooks import RESERVED_ADAPTER_NAME  # noqa: F401
from deltaserve_core.hostkit import published_name  # noqa: F401
from deltaserve_core.testing.reference_host import ReferenceHost, _as_list, _Lora, _Row, _Seq  # noqa: F401
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
    """ft_slot_scaling_fixed: see the module docstring."""

    def set_finetune_adapter(self, state: LoraAdapterState) -> None:
        lora, slot = self._to_lora(state), self._adapters.get(RESERVED_ADAPTER_NAME)
        if slot is not None:  # BUG: the reserved slot keeps the scaling it was created with
            lora = _Lora(slot.scaling, lora.pairs)
        self._adapters[RESERVED_ADAPTER_NAME] = lora
