"""should_abort is asked at every second decoder-layer boundary only.

Rule: hooks.py, ActivationSink.should_abort: "Called by: the host at every decoder-layer boundary of a step that
carries *only* fine-tuning rows"

Bug: to save the round trip to the scheduler, the runner polls the abort flag once per pair of layers (before layers
0, 2, 4, ...; a fused two-layer launch / pipeline micro-stage): an abort that comes up at an odd boundary is honoured
one layer late, and the last layer of an even-layered model is never guarded. Outputs and captures are exact.
Trigger: every fine-tuning-only step (on the 2-layer test model: one poll instead of two; an abort wanted before
layer 1 is not heard).
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
    """abort_polled_even_layers: see the module docstring."""

    def _execute(self, step_id: int, rows: list[_Row], tokens: torch.Tensor, synthetic: bool = False) -> StepRecord:
        sink = self._activation_sink
        ft_rows = [r for r in rows if r.sample is not None]
        ft_only = bool(ft_rows) and len(ft_rows) == len(rows)
        capture = sink is not None and bool(ft_rows) and not synthetic
        aborted = False
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
        start = time.monotonic()
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
                if ft_only and sink is not None and not synthetic and li % 2 == 0 and sink.should_abort(step_id):  # BUG
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
