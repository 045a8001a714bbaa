"""A calibration step is timed from the start of run_profile_step: building its dummy inputs counts as forward time.

Rule: hooks.py, HostHooks.run_profile_step: "Its ``duration_s`` is seconds of the step's own forward, as for every step
(calibration fits it next to served steps)" / types.py, StepRecord: "it starts with the forward"

Bug: the profile path starts its timer when the call begins (vLLM's profile timing wraps ``profile_run``, dummy input
preparation included): the random dummy KV of the decode rows and the random prompts are timed with the forward, so
calibration prices decode KV far above what served steps cost. Served steps are exact; shapes without decode rows
are nearly exact.
Trigger: every calibration shape with decode rows (large by decode_context x num_decode).
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
    """profile_clock_includes_dummy_inputs: see the module docstring."""

    def run_profile_step(self, shape: ProfileShape) -> StepRecord:
        self.__dict__["_profile_t0"] = time.monotonic()  # BUG: the profile clock starts with the dummy inputs
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
        return record

    def _execute(self, step_id: int, rows: list[_Row], tokens: torch.Tensor, synthetic: bool = False) -> StepRecord:
        sink = self._activation_sink
        ft_rows = [r for r in rows if r.sample is not None]
        ft_only = bool(ft_rows) and len(ft_rows) == len(rows)
        capture = sink is not None and bool(ft_rows) and not synthetic
        aborted = False
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
        start = (self.__dict__.pop("_profile_t0", None) if synthetic else None) or time.monotonic()  # BUG
        with torch.inference_mode():
            if capture:
                sink.begin_step(step_id, [r.sample for r in ft_rows])  # type: ignore[misc]
            tokens = tokens.to(self.device)
            positions = torch.cat([torch.arange(r.past, r.past + r.length) for r in rows]).to(self.device)
            groups: dict[str, list[int]] = {}
            for r in rows:
                if r.adapter is not None:
                    groups.setdefault(r.adapter, []).extend(range(r.start, r.start + r.length))
            index = {a: torch.tensor(v, device=self.device) for a, v in groups.items()}
            hidden = self._inner.embed_tokens(tokens)
            cos, sin = self._inner.rotary_emb(hidden.unsqueeze(0), positions.unsqueeze(0))
            for li, layer in enumerate(self._layers):
                if ft_only and sink is not None and not synthetic and sink.should_abort(step_id):
                    aborted = True
                    break
                if capture:
                    for r in ft_rows:
                        sink.layer_input(step_id, li, r.sample.sample_id,  # type: ignore[union-attr]
                                         hidden[r.start:r.start + r.length])
                elif synthetic and ft_rows:
                    for r in ft_rows:  # the copy a capture sink makes, so calibration prices it
                        hidden[r.start:r.start + r.length].clone()
                hidden = self._layer(li, layer, hidden, rows, cos, sin, index)
            if not aborted:
                self._sample(rows, hidden)
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
        duration = time.monotonic() - start
        ft_ids = tuple(r.sample.sample_id for r in ft_rows)  # type: ignore[union-attr]
        if capture:
            sink.end_step(step_id, () if aborted else ft_ids, ft_ids if aborted else ())  # type: ignore[union-attr]
        record = StepRecord(
            step_id=step_id, start_time=start, duration_s=duration, mode=ExecutionMode.EAGER,
            prefill_lengths=tuple(r.length for r in rows if r.sample is None and r.past == 0 and r.fake_kv is None),
            num_decode=sum(1 for r in rows if r.sample is None and (r.past > 0 or r.fake_kv is not None)),
            kv_tokens=sum(r.past for r in rows if r.sample is None and (r.past > 0 or r.fake_kv is not None)),
            finetune_sample_ids=() if aborted else ft_ids,
            finetune_lengths=() if aborted else tuple(r.length for r in ft_rows),
            aborted_sample_ids=ft_ids if aborted else (), synthetic=synthetic,
        )
        if self._step_sink is not None:
            self._step_sink(record)
        return record
