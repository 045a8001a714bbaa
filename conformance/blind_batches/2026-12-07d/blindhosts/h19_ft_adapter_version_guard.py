"""set_finetune_adapter skips a state whose version is lower than the one loaded (a stale-update guard).

Rule: hooks.py, HostHooks.set_finetune_adapter: "Fine-tuning rows of later steps must use exactly these weights (the training path is only exact if the forward sees the current adapter)."

Bug: the weight-sync path ignores updates that do not move the version forward (a guard against out-of-order
updates, as weight-sync endpoints of RL serving stacks have): after a job restarts from an older checkpoint, or a new
job starts on the running engine at version 0/1, the reserved slot keeps the newer weights. Increasing versions (one
job's optimizer steps) are exact.
Trigger: a state with a lower version than the loaded one (job restart from a checkpoint, a second job).
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
from deltaserve_core.hostkit import profile_seed, published_name  # noqa: F401
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
    """ft_adapter_version_guard: see the module docstring."""

    def set_finetune_adapter(self, state: LoraAdapterState) -> None:
        if state.version < self.__dict__.get("_ft_version", state.version):  # BUG: an older version is skipped
            return
        self.__dict__["_ft_version"] = state.version
        self._adapters[RESERVED_ADAPTER_NAME] = self._to_lora(state)
