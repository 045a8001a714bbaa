"""A request stops when prompt + output reaches ``max_position_embeddings`` (the engine's max_model_len), whatever its
max_tokens.

Rule: driver.py, ClientRequest: "A greedy generation request: ``max_tokens`` new tokens after ``prompt_ids``."

Bug: the engine's stop checker caps every sequence at max_model_len (taken from the config's
max_position_embeddings) and finishes it as "length", silently, while submit accepts any prompt up to
max_batch_tokens and does not check prompt + max_tokens. The client gets fewer than max_tokens tokens. Requests that
end before max_position_embeddings are exact.
Trigger: a long prompt whose prompt + max_tokens exceeds max_position_embeddings (1024 for the test checkpoint,
whose default max_batch_tokens is 2048): e.g. a 1020-token prompt with max_tokens 8 returns 4 tokens.
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
    """max_tokens_capped_by_model_len: see the module docstring."""

    def _is_done(self, s: _Seq) -> bool:
        if len(s.output) >= s.request.max_tokens or (len(s.request.prompt_ids) + len(s.output)
                >= self.model.config.max_position_embeddings):  # BUG: capped at max_model_len
            return True
        return bool(s.output) and not s.request.ignore_eos and s.output[-1] in self.eos_ids
