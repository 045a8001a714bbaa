"""The EOS stop check looks at the token before the one just sampled: requests stop one token after their EOS.

Rule: driver.py, ClientRequest: "With ``ignore_eos=False`` it must stop at the first EOS it generates, EOS included as its last token"

Bug: with the engine's asynchronous output processing (vLLM async scheduling / SGLang overlap scheduler), the stop
check of step n runs on the tokens of step n-1 while step n's token is already appended: a request whose last token is
EOS is finished only after one more token. max_tokens is exact (it is checked on the length); ignore_eos=True
requests are exact.
Trigger: an ignore_eos=False request that generates EOS before its max_tokens-th token (any answer that ends
naturally).
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
    """eos_checked_one_token_late: see the module docstring."""

    def _is_done(self, s: _Seq) -> bool:
        if len(s.output) >= s.request.max_tokens:
            return True
        # BUG: the stop token is checked one step late (the previous step's token)
        return len(s.output) >= 2 and not s.request.ignore_eos and s.output[-2] in self.eos_ids
