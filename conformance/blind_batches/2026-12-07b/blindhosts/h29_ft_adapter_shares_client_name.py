"""set_finetune_adapter also loads the weights under the job's adapter name, replacing a client adapter of that name.

Rule: hooks.py, HostHooks.set_finetune_adapter: "it changes the reserved adapter only, never the adapter (or the
adapter slot) of a client request."

Bug: the engine's LoRA table is keyed by the state's own name (``lora_name=state.name``) and the reserved name is an
alias of that entry; when a client adapter of the same name is loaded (a job that continues training the adapter
clients are served, under its name), every optimizer step overwrites what that client adapter serves.
Trigger: a fine-tuning job whose adapter name equals a loaded client adapter's name (continuing to train a served
adapter), and requests on that client adapter afterwards.
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
    """ft_adapter_shares_client_name: see the module docstring."""

    def set_finetune_adapter(self, state: LoraAdapterState) -> None:
        lora = self._to_lora(state)
        self._adapters[RESERVED_ADAPTER_NAME] = lora
        if state.name in self._adapters:  # BUG: the table entry of the state's own name is the same slot
            self._adapters[state.name] = lora
