"""A request naming the empty adapter ``""`` is served on the base model instead of being refused.

Rule: driver.py, check_client_adapter: "What every host's ``submit`` must refuse: the reserved fine-tuning adapter, and
adapters it never loaded."

Bug: the adapter tests the request's adapter by truthiness (``if request.adapter:``, as a ``lora_request``-or-None
path does), so an empty name falls through to the base model and is accepted. Named adapters, known or unknown, are
handled right.
Trigger: a request with ``adapter=""`` (a client that sends an empty model / LoRA field).
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
    """empty_adapter_served_base: see the module docstring."""

    def submit(self, request: ClientRequest) -> None:
        if not request.adapter:  # BUG: an empty adapter name means the base model
            request = dataclasses.replace(request, adapter=None)
        check_client_adapter(request, self._adapters)
        if len(request.prompt_ids) > self.config.max_batch_tokens:
            raise ValueError(f"request {request.request_id!r}: prompt of {len(request.prompt_ids)} tokens exceeds "
                             f"max_batch_tokens={self.config.max_batch_tokens}; raise it in HostConfig")
        self._enqueue(request)
