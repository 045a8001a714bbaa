"""Broken host h09: fine-tuning rows produce an output that ``step()`` returns.

Rule (hooks.py, HostHooks.intercept_schedule): the host "adds the returned samples to that same step as
prefill-only rows on the reserved adapter (no prefix-cache reads, no sampling output), retires them after that one
forward, and never lets them reach a client."
Bug: the reserved rows are sampled like any new request (max_tokens=1) and, finishing at once, go out with the
step's finished requests under an internal id (as a vLLM adapter does when it finishes them *after*
``update_from_output``).
Trigger: a client-driven ``step()`` that carries fine-tuning rows."""

from __future__ import annotations

import dataclasses
import logging
import threading
import time
from collections import deque
from collections.abc import Sequence

import torch

from deltaserve_core.adapter_state import LoraAdapterState, parse_peft_key
from deltaserve_core.driver import ClientOutput, ClientRequest, check_client_adapter
from deltaserve_core.hooks import RESERVED_ADAPTER_NAME, ActivationSink, ReservedAdapterError, ScheduleInterceptor, StepSink
from deltaserve_core.testing.reference_host import ReferenceHost, _Lora, _Row, _Seq
from deltaserve_core.types import (
    ExecutionMode,
    FineTuneSample,
    HostCapabilities,
    ProfileShape,
    ProposedBatch,
    StepRecord,
)

log = logging.getLogger(__name__)


class Host(ReferenceHost):
    """Samples fine-tuning rows and returns them as finished ClientOutputs from step()."""

    name = "blind-h09"

    def step(self) -> list[ClientOutput]:
        self._ft_outputs: list[ClientOutput] = []
        outputs = super().step()
        return outputs + self._ft_outputs

    def _sample(self, rows, hidden):
        super()._sample(rows, hidden)
        ft = [r for r in rows if r.sample is not None]
        if not ft or not hasattr(self, "_ft_outputs"):
            return
        last = torch.tensor([r.start + r.length - 1 for r in ft], device=hidden.device)
        logits = self.model.lm_head(self._inner.norm(hidden.index_select(0, last)))
        now = time.monotonic()
        for r, tok in zip(ft, logits.argmax(dim=-1).tolist()):
            self._ft_outputs.append(ClientOutput(f"{RESERVED_ADAPTER_NAME}-{r.sample.sample_id}", (int(tok),),
                                                 now, now, now, (now,)))
