"""Calibration's dummy requests count as unfinished work until the next scheduler pass frees them.

Rule: driver.py, HostDriver.has_unfinished: "Fine-tuning and calibration rows never count: it is False once every
client request has been returned, whatever ran since."

Bug: the profile step registers its dummy requests with the scheduler (as vLLM / SGLang dummy runs do) and they are
freed lazily by the next scheduling pass; has_unfinished() asks the scheduler whether it holds requests, so after a
calibration step it answers True until step() runs (and run_idle_step() refuses to run meanwhile). Served traffic is
exact.
Trigger: has_unfinished() (or run_idle_step()) right after calibration, before any client step.
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
    """profile_rows_counted_unfinished: see the module docstring."""

    def run_profile_step(self, shape: ProfileShape) -> StepRecord:
        gen = torch.Generator().manual_seed(profile_seed(shape))
        vocab = self.model.config.vocab_size
        rows: list[_Row] = []
        pos = 0
        for n in shape.prefill_lengths:
            rows.append(_Row(pos, n, None))
            pos += n
        for _ in range(shape.num_decode):
            kv = [(torch.randn(self.num_kv_heads, shape.decode_context, self.head_dim, dtype=self.dtype,
                               device=self.device, generator=None),) * 2 for _ in range(len(self._layers))]
            rows.append(_Row(pos, 1, None, past=shape.decode_context, fake_kv=kv))  # type: ignore[arg-type]
            pos += 1
        for i, n in enumerate(shape.finetune_lengths):
            ids = tuple(torch.randint(0, vocab, (n,), generator=gen).tolist())
            rows.append(_Row(pos, n, RESERVED_ADAPTER_NAME if RESERVED_ADAPTER_NAME in self._adapters else None,
                             sample=FineTuneSample(-1 - i, ids, (False,) + (True,) * (n - 1))))
            pos += n
        tokens = torch.randint(0, vocab, (pos,), generator=gen)
        for r in rows:
            if r.sample is not None:
                tokens[r.start:r.start + r.length] = torch.tensor(r.sample.input_ids)
        record = self._execute(next(self._step_ids), rows, tokens, synthetic=True)
        self.__dict__["_dummy_rows"] = rows  # BUG: dummy requests stay registered until the next pass
        return record

    def has_unfinished(self) -> bool:
        return bool(self._waiting or self._running or self._kept or self.__dict__.get("_dummy_rows"))  # BUG

    def _step(self, allow_idle: bool, report_executed: bool = False):  # noqa: ANN202 - two return shapes
        self.__dict__.pop("_dummy_rows", None)  # plumbing: the scheduling pass frees calibration's dummy requests
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
