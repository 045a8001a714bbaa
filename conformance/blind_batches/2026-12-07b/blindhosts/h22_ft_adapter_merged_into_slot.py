"""set_finetune_adapter updates the reserved slot module by module: modules the new state lacks keep the old weights.

Rule: hooks.py, HostHooks.set_finetune_adapter: "Fine-tuning rows of later steps must use exactly these weights"

Bug: the slot is updated in place key by key (``slot.update(new_pairs)``), an optimisation of the per-step weight
copy; a module present in the previous state and absent from the new one is never cleared. Within one job (same
target modules every step) it is exact.
Trigger: a new fine-tuning job on the running engine whose adapter targets fewer modules than the previous job's
(e.g. a job on q/v after a job on q/k/v/o): its rows run with the previous job's k/o LoRA still applied.
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
    """ft_adapter_merged_into_slot: see the module docstring."""

    def set_finetune_adapter(self, state: LoraAdapterState) -> None:
        lora = self._to_lora(state)
        old = self._adapters.get(RESERVED_ADAPTER_NAME)
        if old is not None:  # BUG: stale modules of the previous state are kept
            lora.pairs = {**old.pairs, **lora.pairs}
        self._adapters[RESERVED_ADAPTER_NAME] = lora
