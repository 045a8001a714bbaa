"""capabilities() declares the engine's default token budget (8192) instead of the host's max_batch_tokens.

Rule: types.py, HostCapabilities: "It must be the host's whole per-step token budget (``HostConfig.max_batch_tokens``
for a host started from one)"

Bug: the adapter fills max_finetune_tokens_per_step from the engine's default scheduler config
(``max_num_batched_tokens`` 8192, the default of vLLM's and SGLang's chunked-prefill budget) rather than from the
running engine's configured one; the engine itself schedules with max_batch_tokens. The core may then offer up to 8192
fine-tuning tokens a step, which the engine (sized for 2048) refuses with an error.
Trigger: every host started with a max_batch_tokens other than 8192 (the HostConfig default, 2048).
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
    """ft_budget_engine_default: see the module docstring."""

    def capabilities(self) -> HostCapabilities:
        return dataclasses.replace(self._capabilities, max_finetune_tokens_per_step=8192)  # BUG: engine default
