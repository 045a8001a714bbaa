"""The step's LoRA weights are resolved once per set of adapter names and reused while that set does not change.

Rule: hooks.py, HostHooks.set_finetune_adapter: "Fine-tuning rows of later steps must use exactly these weights"

Bug: like a LoRA manager that re-stacks its slot weights only when the set of active adapters changes
(``set_active_adapters`` skipped when the mapping is unchanged), the host resolves each adapter name to its weights
when a step's set of adapter names differs from the previous step's and reuses that mapping otherwise.
``set_finetune_adapter`` replaces the host's table entry, but consecutive steps with the same adapters (the
reserved one every training step) keep the old weights.
Trigger: two steps carrying fine-tuning rows with an optimizer step (set_finetune_adapter) between them and no step
with another set of adapters in between: every training loop.
"""
from __future__ import annotations

import dataclasses  # noqa: F401
import math  # noqa: F401
import time  # noqa: F401
from collections.abc import Sequence  # noqa: F401

import torch  # noqa: F401
import torch.nn.functional as F  # noqa: F401

from deltaserve_core.adapter_state import LoraAdapterState, parse_peft_key  # noqa: F401
from deltaserve_core.driver import ClientOutput, ClientRequest, check_client_adapter, take_kept  # noqa: F401
from deltaserve_core.hooks import RESERVED_ADAPTER_NAME  # noqa: F401
from deltaserve_core.hostkit import published_name  # noqa: F401
from deltaserve_core.testing.reference_host import ReferenceHost, _Lora, _Row, _Seq  # noqa: F401
from deltaserve_core.types import (  # noqa: F401
    ExecutionMode,
    FineTuneSample,
    ModelSpec,
    ProposedBatch,
    ScheduledRequest,
    StepRecord,
)


class Host(ReferenceHost):
    """lora_mapping_cached_by_names: see the module docstring."""

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
            key = tuple(sorted(groups))
            if key != getattr(self, "_mapping_key", None):  # BUG: weights resolved only when the set of names changes
                self._mapping_key = key
                self._mapping = {a: (self._adapters.get(a) or self._withdrawn[a]) for a in groups}
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

    def _linear(self, x: torch.Tensor, module: torch.nn.Module, layer: int, name: str,
                groups: dict[str, torch.Tensor]) -> torch.Tensor:
        out = module(x)
        for adapter, index in groups.items():
            lora = self._mapping[adapter]  # BUG: the cached mapping
            pair = lora.pairs.get((layer, name))
            if pair is None:
                continue
            a, b = pair
            # Same order of operations as PEFT's LoRA layer: B(A(x)) * scaling, added to the base output.
            out.index_add_(0, index, (x.index_select(0, index) @ a.T @ b.T) * lora.scaling)
        return out
