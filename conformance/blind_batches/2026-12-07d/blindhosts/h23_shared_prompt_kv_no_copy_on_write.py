"""Requests with the same prompt admitted in one step share one KV cache without copy-on-write.

Rule: driver.py, ClientRequest: "A greedy generation request: ``max_tokens`` new tokens after ``prompt_ids``."

Bug: the prefix cache matches a prompt against the requests admitted in the same step and points the later request at
the earlier one's KV blocks; decode then appends both requests' tokens to the shared blocks (no copy-on-write of the
last, partly filled block), so from their second decode step each attends over the other's tokens and at shifted
positions. Distinct prompts, or identical ones on different adapters, are exact.
Trigger: the same prompt twice on one adapter (or the base) in flight together: n > 1 style fan-out, retried
requests, benchmark traffic with repeated prompts.
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
    """shared_prompt_kv_no_copy_on_write: see the module docstring."""

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
        for i, s in enumerate(prefills):  # BUG: an identical prompt of this step shares the earlier one's KV
            twin = next((o for o in prefills[:i] if o.request.prompt_ids == s.request.prompt_ids
                         and o.request.adapter == s.request.adapter), None)
            if twin is not None:
                s.kv = twin.kv
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
