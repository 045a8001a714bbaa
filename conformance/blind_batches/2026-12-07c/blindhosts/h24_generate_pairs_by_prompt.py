"""generate() pairs outputs with requests by prompt tokens: requests with identical prompts all get the first one's
output.

Rule: driver.py, HostDriver.generate: "Returns exactly one output per request, in request order, never in the order
they finished (callers pair outputs with requests by position)."

Bug: the engine's offline API hands results back keyed by prompt (a dict from prompt token ids to output); the
adapter rebuilds the request order from it. With two requests of one prompt, both positions get the output of the
first (its request id, its tokens): the second request's output is lost even when its adapter or max_tokens differ.
Trigger: identical prompts in one generate() call (the same prompt on two adapters, an A/B comparison of a published
version against the base, repeated benchmark prompts).
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
    """generate_pairs_by_prompt: see the module docstring."""

    def generate(self, requests: Sequence[ClientRequest]) -> list[ClientOutput]:
        finished = run_to_completion(self, requests, self._kept)
        by_prompt = {}
        for r, o in zip(requests, finished):  # BUG: results keyed by prompt tokens
            by_prompt.setdefault(r.prompt_ids, o)
        return [by_prompt[r.prompt_ids] for r in requests]
