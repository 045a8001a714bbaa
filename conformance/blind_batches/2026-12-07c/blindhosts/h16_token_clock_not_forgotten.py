"""The token clock (request id -> first token time) is never cleared: a reused request id starts with a first token.

Rule: types.py, ScheduledRequest: "``first_token_time`` is set once the request has produced its first token" and
"A token's time is never before the forward of the step that produced it began"

Bug: the adapter stamps first-token times in a dict keyed by request id that it forgets only for aborted requests,
not for requests that finish; the ScheduledRequest views read first_token_time from it. A request submitted under
the id of one that already finished is offered with that request's first-token time: in its prefill step (no token
yet) and in every decode (TTFT before its own arrival). Client outputs are right.
Trigger: a request id reused after a request of that id finished (clients that number requests per session or per
benchmark run: ``req-0``, ``req-1``, ...).
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
    """token_clock_not_forgotten: see the module docstring."""

    def _clocked(self, view):
        """plumbing: the view's first-token time from the host's token clock (exact while ids are unique)."""
        first = self.__dict__.get("_first_token_at", {}).get(view.request_id)
        return view if first is None else dataclasses.replace(view, first_token_time=first)

    def _sample(self, rows: list[_Row], hidden: torch.Tensor) -> None:
        # Synthetic (calibration) inference rows are sampled too, so profiled steps cost what real ones do.
        inference = [r for r in rows if r.sample is None]
        if not inference:
            return
        last = torch.tensor([r.start + r.length - 1 for r in inference], device=hidden.device)
        logits = self.model.lm_head(self._inner.norm(hidden.index_select(0, last)))
        tokens = logits.argmax(dim=-1).tolist()
        now = time.monotonic()
        for r, tok in zip(inference, tokens):
            if r.seq is not None:
                r.seq.output.append(int(tok))
                r.seq.token_times.append(now)
                self.__dict__.setdefault("_first_token_at", {}).setdefault(r.seq.request.request_id, now)  # BUG: never forgotten

    def _step(self, allow_idle: bool, report_executed: bool = False):  # noqa: ANN202 - two return shapes
        prefills, decodes, left = self._schedule()
        deferred = [s for s in self._running if s not in decodes]
        step_id = next(self._step_ids)
        now = time.monotonic()
        batch = ProposedBatch(
            step_id=step_id, now=now,
            scheduled=tuple(self._clocked(v) for v in [s.view(True) for s in prefills] + [s.view(False) for s in decodes]),
            waiting=tuple(self._clocked(v) for v in [s.view(True) for s in left] + [s.view(False) for s in deferred]),
        )
        batch = ProposedBatch(batch.step_id, batch.now, batch.scheduled, batch.waiting, self.graph_mode(batch))
        samples: Sequence[FineTuneSample] = ()
        if self._interceptor is not None and (batch.scheduled or allow_idle or not self.has_unfinished()):
            samples = tuple(self._interceptor.on_schedule(batch))
        if samples and RESERVED_ADAPTER_NAME not in self._adapters:
            raise RuntimeError("fine-tuning samples were injected before set_finetune_adapter() loaded the reserved "
                               "adapter; the core must call set_finetune_adapter first")
        ft_tokens = sum(s.num_tokens for s in samples)
        if ft_tokens > self._capabilities.max_finetune_tokens_per_step:
            raise RuntimeError(f"interceptor injected {ft_tokens} fine-tuning tokens, over this host's "
                               f"max_finetune_tokens_per_step={self._capabilities.max_finetune_tokens_per_step}")
        if samples and decodes and not self.mixed:
            raise RuntimeError("fine-tuning rows were injected into a decode step of a host without mixed batches "
                               "(capabilities().mixed_batches is False); the core must admit only into prefill steps")
        if not prefills and not decodes and not samples:
            return False if report_executed else []
        rows: list[_Row] = []
        ids: list[int] = []
        for s in prefills:
            rows.append(_Row(len(ids), len(s.request.prompt_ids), s.request.adapter, seq=s))
            ids.extend(s.request.prompt_ids)
        for s in decodes:
            rows.append(_Row(len(ids), 1, s.request.adapter, seq=s, past=s.context))
            ids.append(s.output[-1])
        for sample in samples:
            rows.append(_Row(len(ids), sample.num_tokens, RESERVED_ADAPTER_NAME, sample=sample))
            ids.extend(sample.input_ids)
        self._running.extend(prefills)
        self._execute(step_id, rows, torch.tensor(ids, dtype=torch.long))
        outputs = []
        for s in [s for s in self._running if self._is_done(s)]:
            self._running.remove(s)
            out = ClientOutput(s.request.request_id, tuple(s.output), s.arrival_time, s.token_times[0],
                               s.token_times[-1], tuple(s.token_times))
            outputs.append(out)
        if self._withdrawn:
            self._forget_withdrawn()
        if report_executed:
            return True
        return outputs
