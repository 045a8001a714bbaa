"""The pad id is a stop token too: ignore_eos=False requests stop at the first pad id they generate.

Rule: driver.py, ClientRequest: "With ``ignore_eos=False`` it must stop at the first EOS it generates, EOS included as its last token" / driver.py, ClientRequest: "A greedy generation request: ``max_tokens`` new tokens after ``prompt_ids``."

Bug: the adapter builds the stop-token set from the checkpoint's special tokens (``eos_token_id`` and
``pad_token_id``), as stop lists copied from a padding-aware generation loop do: a request with ignore_eos=False that
generates the pad id stops there, short of max_tokens. Checkpoints whose pad id is the EOS id, or that have none, are
exact; ignore_eos=True requests are exact.
Trigger: an ignore_eos=False request whose greedy continuation holds the pad id (test checkpoint: pad 0).
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
    """pad_token_stops: see the module docstring."""

    def _is_done(self, s: _Seq) -> bool:
        if len(s.output) >= s.request.max_tokens:
            return True
        stops = self.eos_ids | ({getattr(self.model.config, "pad_token_id", None)} - {None})  # BUG: pad stops
        return bool(s.output) and not s.request.ignore_eos and s.output[-1] in stops
