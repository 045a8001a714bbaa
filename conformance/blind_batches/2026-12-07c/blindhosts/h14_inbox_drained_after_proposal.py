"""Submitted requests wait in an inbox that is moved to the waiting queue only after the step was proposed.

Rule: types.py, ProposedBatch: "Every request that arrived and has not finished must be in ``scheduled`` or
``waiting`` (the core prices admission against all of them)."

Bug: submit() puts the request on the engine's input queue (on_arrival is called, has_unfinished counts it); the
engine loop drains that queue into the waiting queue after the scheduler has proposed the step and on_schedule has
seen it. A request submitted between two steps is in neither ``scheduled`` nor ``waiting`` of the next proposal and
is admitted one step later.
Trigger: a request submitted while other requests are running (continuous batching: every arrival under load). On
an otherwise idle engine the first step() after submit runs nothing.
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
    """inbox_drained_after_proposal: see the module docstring."""

    def _enqueue(self, request: ClientRequest) -> None:
        """Queue an admitted request and tell the core it arrived (``submit`` after its checks)."""
        now = time.monotonic()
        with self._lock:
            self.__dict__.setdefault("_inbox", []).append(_Seq(request, now))  # BUG: the inbox, drained after the proposal
        if self._interceptor is not None:
            self._interceptor.on_arrival(request.request_id, now)

    def _step(self, allow_idle: bool, report_executed: bool = False):  # noqa: ANN202 - two return shapes
        prefills, decodes, left = self._schedule()
        deferred = [s for s in self._running if s not in decodes]
        step_id = next(self._step_ids)
        now = time.monotonic()
        batch = ProposedBatch(
            step_id=step_id, now=now,
            scheduled=tuple([s.view(True) for s in prefills] + [s.view(False) for s in decodes]),
            waiting=tuple([s.view(True) for s in left] + [s.view(False) for s in deferred]),
        )
        batch = ProposedBatch(batch.step_id, batch.now, batch.scheduled, batch.waiting, self.graph_mode(batch))
        samples: Sequence[FineTuneSample] = ()
        if self._interceptor is not None and (batch.scheduled or allow_idle or not self.has_unfinished()):
            samples = tuple(self._interceptor.on_schedule(batch))
        with self._lock:  # BUG: the inbox is moved to the waiting queue only after the step was proposed
            self._waiting.extend(self.__dict__.pop("_inbox", []))
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

    def has_unfinished(self) -> bool:
        return bool(self._waiting or self._running or self._kept or self.__dict__.get("_inbox"))  # plumbing: the inbox counts

    def _forget_withdrawn(self) -> None:
        with self._lock:
            unfinished = [s.request for s in [*self._waiting, *self.__dict__.get("_inbox", [])]]  # plumbing
        self._withdrawn.release(unfinished + [s.request for s in self._running])

    def shutdown(self) -> None:
        self._waiting.clear()
        self.__dict__.pop("_inbox", None)  # plumbing
        self._running.clear()
        self._kept.clear()
