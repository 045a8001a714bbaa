"""submit resolves adapter names against every resident LoRA slot: a retracted version is accepted while it is still
resident.

Rule: hooks.py, HostHooks.retract_adapter: "Afterwards a request naming ``name`` is refused by ``submit`` exactly as
one naming an adapter the host never loaded"

Bug: a retracted version stays resident until the requests submitted on it before the retraction finish (correct);
the name lookup of submit searches the resident slots, not the servable names, so new requests on the retracted
version are accepted and served on its weights until the last of them finishes.
Trigger: a request on the retracted version while earlier requests on it are still running or queued (the core
prunes right after a publish, while clients of the oldest version may still be decoding).
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
    """retract_resident_still_accepted: see the module docstring."""

    def submit(self, request: ClientRequest) -> None:
        check_client_adapter(request, [*self._adapters, *self._withdrawn._held])  # BUG: every resident slot
        if len(request.prompt_ids) > self.config.max_batch_tokens:
            raise ValueError(f"request {request.request_id!r}: prompt of {len(request.prompt_ids)} tokens exceeds "
                             f"max_batch_tokens={self.config.max_batch_tokens}; raise it in HostConfig")
        self._enqueue(request)
