"""Only the first id of a list-valued ``eos_token_id`` stops a request.

Rule: driver.py, ClientRequest: "With ``ignore_eos=False`` it must stop at the first EOS it generates, EOS included
as its last token"

Bug: the engine keeps a scalar EOS id (``eos_token_id[0]`` when the config gives a list); the other EOS ids of the
checkpoint (Llama-3 Instruct's ``<|eot_id|>`` / ``<|eom_id|>``, Qwen2.5 / Qwen3's ``<|im_end|>`` next to
``<|endoftext|>``) never stop a request. Checkpoints with a single EOS id are exact.
Trigger: an ignore_eos=False request on a checkpoint with several EOS ids that generates one of the later ones
(every chat turn of Llama-3 Instruct ends in ``<|eot_id|>``, the second id of its list; proof: the tiny Llama with
``eos_token_id = [2, t]``). The 2-layer test checkpoint (a single EOS id) is exact.
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
    """eos_list_first_only: see the module docstring."""

    def _is_done(self, s: _Seq) -> bool:
        if len(s.output) >= s.request.max_tokens:
            return True
        eos = _as_list(getattr(self.model.config, "eos_token_id", None))[:1]  # BUG: a scalar EOS id (the list's first)
        return bool(s.output) and not s.request.ignore_eos and s.output[-1] in eos
