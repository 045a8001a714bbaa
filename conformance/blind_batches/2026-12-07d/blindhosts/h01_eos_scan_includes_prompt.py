"""The EOS stop check scans the whole sequence (prompt included), not the generated tokens.

Rule: driver.py, ClientRequest: "With ``ignore_eos=False`` it must stop at the first EOS it generates, EOS included as its last token"

Bug: the stop checker asks whether any token of the sequence is an EOS id (``seq.get_token_ids()``, prompt and output
together) instead of looking at the token just generated, as a stop-string / stop-token scanner written for the
output text and moved onto token ids does. A request with ignore_eos=False whose prompt holds an EOS id stops after
its first generated token. Prompts without an EOS id are exact; ignore_eos=True requests are exact.
Trigger: an ignore_eos=False request whose prompt contains the EOS id: chat transcripts that separate turns with
``</s>`` / ``<|eot_id|>``, few-shot prompts built from several documents.
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
    """eos_scan_includes_prompt: see the module docstring."""

    def _is_done(self, s: _Seq) -> bool:
        if len(s.output) >= s.request.max_tokens:
            return True
        seq = tuple(s.request.prompt_ids) + tuple(s.output)  # BUG: the scan covers the prompt too
        return bool(s.output) and not s.request.ignore_eos and any(t in self.eos_ids for t in seq)
