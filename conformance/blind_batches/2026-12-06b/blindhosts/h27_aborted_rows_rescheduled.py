"""h27: fine-tuning rows of an aborted step are re-queued like preempted requests and run in the next step.

Rule (hooks.py, HostHooks.intercept_schedule): "Samples the step cannot take are refused in that step's record
(``aborted_sample_ids``), never carried to a later step." with hooks.py, ActivationSink.should_abort: "On ``True`` the
host stops the forward at that boundary, calls :meth:`end_step` with all samples aborted and reports them in
``StepRecord.aborted_sample_ids``." (types.py, StepRecord: their "captures are void and they go back to the pool".)

Bug: the adapter implements the abort with the engine's preemption path: the fine-tuning rows of an aborted step
are reported aborted (right), but also put back at the front of the engine's queue like preempted requests, so they
run again in the next step, beside whatever on_schedule returns: the record lists samples the core never admitted
to that step (and has already returned to its pool).

Trigger: any abort of a fine-tuning-only step (a client request arriving during it) followed by another step.
"""
from __future__ import annotations

from deltaserve_core.testing.reference_host import ReferenceHost, _Row  # noqa: F401
import time
from collections.abc import Sequence

import torch

from deltaserve_core.driver import ClientOutput
from deltaserve_core.hooks import RESERVED_ADAPTER_NAME
from deltaserve_core.types import ExecutionMode, FineTuneSample, ProposedBatch, StepRecord


class Host(ReferenceHost):
    def __init__(self, config) -> None:
        super().__init__(config)
        self._preempted: list[FineTuneSample] = []

    def _execute(self, step_id, rows, tokens, synthetic=False) -> StepRecord:
        record = super()._execute(step_id, rows, tokens, synthetic)
        if record.aborted_sample_ids:  # preemption: the stopped rows go back to the front of the queue
            self._preempted = [r.sample for r in rows if r.sample is not None]
        return record

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
        if self._preempted:  # BUG: aborted FT rows re-run like preempted requests, beside the admitted ones
            samples, self._preempted = tuple(self._preempted) + tuple(samples), []
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
        if report_executed:
            return True
        return outputs
