"""Broken host h30: the waiting queue is rebuilt after the step from the scheduler's snapshot.

Rule (hooks.py, ScheduleInterceptor.on_arrival): requests are accepted "from whichever thread accepts requests (it
may run while a step executes)"; driver.py HostDriver.submit: "Enqueue one request without running the engine".
Bug: the scheduler commits ``waiting = deque(left)`` after the forward, which drops any request another thread
submitted while the step was executing (its on_arrival was delivered, the request never runs).
Trigger: a submit from another thread during a step."""

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
    """Requests submitted while a step executes are lost."""

    name = "blind-h30"

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
        with self._lock:
            self._waiting = deque(left)  # commit what this pass left waiting
        outputs = []
        for s in [s for s in self._running if self._is_done(s)]:
            self._running.remove(s)
            out = ClientOutput(s.request.request_id, tuple(s.output), s.arrival_time, s.token_times[0],
                               s.token_times[-1], tuple(s.token_times))
            outputs.append(out)
        if report_executed:
            return True
        return outputs
