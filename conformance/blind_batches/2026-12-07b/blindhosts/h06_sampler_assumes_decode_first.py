"""The sampler's last-token offsets assume decode rows come first in the step; the rows are laid out prefill-first.

Rule: driver.py, ClientRequest: "A greedy generation request: ``max_tokens`` new tokens after ``prompt_ids``."

Bug: the logits indices (``query_start_loc``-style cumulative offsets) are computed for a decode-first layout (the
order the engine's attention backend reorders batches to), while the step's rows stay in the scheduler's
prefill-first order. In a step with both a prefill and a decode, each row is sampled from another row's hidden
state. Steps with only prefills or only decodes are exact; fine-tuning rows are never sampled.
Trigger: a request decoding in a step where another request is prefilled (a request arriving while another
generates, under the default ``mixed_batches``).
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
    """sampler_assumes_decode_first: see the module docstring."""

    def _sample(self, rows: list[_Row], hidden: torch.Tensor) -> None:
        # Synthetic (calibration) inference rows are sampled too, so profiled steps cost what real ones do.
        inference = [r for r in rows if r.sample is None]
        if not inference:
            return
        offset, pos = {}, 0
        for r in sorted(inference, key=lambda r: r.past == 0):  # BUG: offsets of a decode-first layout
            offset[id(r)] = pos
            pos += r.length
        last = torch.tensor([offset[id(r)] + r.length - 1 for r in inference], device=hidden.device)
        logits = self.model.lm_head(self._inner.norm(hidden.index_select(0, last)))
        tokens = logits.argmax(dim=-1).tolist()
        now = time.monotonic()
        for r, tok in zip(inference, tokens):
            if r.seq is not None:
                r.seq.output.append(int(tok))
                r.seq.token_times.append(now)
