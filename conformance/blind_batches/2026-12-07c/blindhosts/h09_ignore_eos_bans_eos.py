"""``ignore_eos=True`` is implemented by suppressing EOS (min_tokens = max_tokens): EOS is never sampled.

Rule: driver.py, ClientRequest: "A greedy generation request: ``max_tokens`` new tokens after ``prompt_ids``." and
"with ``ignore_eos=True`` (the default) it runs on to ``max_tokens``."

Bug: the adapter maps ignore_eos=True to the engine's ``min_tokens = max_tokens``, whose logits processor sets the
EOS logits to -inf until max_tokens is reached. The request does run to max_tokens, but where the greedy token is
EOS the engine emits the runner-up instead, and the continuation differs from there. Requests whose greedy
continuation contains no EOS are exact.
Trigger: any default request (ignore_eos=True) whose greedy continuation contains an EOS (benchmark requests that
run past the natural end of an answer).
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
    """ignore_eos_bans_eos: see the module docstring."""

    def _sample(self, rows: list[_Row], hidden: torch.Tensor) -> None:
        # Synthetic (calibration) inference rows are sampled too, so profiled steps cost what real ones do.
        inference = [r for r in rows if r.sample is None]
        if not inference:
            return
        last = torch.tensor([r.start + r.length - 1 for r in inference], device=hidden.device)
        logits = self.model.lm_head(self._inner.norm(hidden.index_select(0, last)))
        for i, r in enumerate(inference):  # BUG: ignore_eos as min_tokens=max_tokens: EOS logits masked
            if r.seq is not None and r.seq.request.ignore_eos and self.eos_ids:
                logits[i, sorted(self.eos_ids)] = float("-inf")
        tokens = logits.argmax(dim=-1).tolist()
        now = time.monotonic()
        for r, tok in zip(inference, tokens):
            if r.seq is not None:
                r.seq.output.append(int(tok))
                r.seq.token_times.append(now)
