"""h26: rotary embedding built with rope_theta read as ``getattr(config, "rope_theta", 10000.0)``.

Rule (driver.py, ClientRequest): "A greedy generation request: ``max_tokens`` new tokens after ``prompt_ids``."

Bug: the adapter builds its own rotary tables (the engine's ``get_rope(head_dim, max_position, base)``) and reads the
base as ``getattr(config, "rope_theta", 10000.0)``. Since transformers 5 the base lives in
``config.rope_parameters["rope_theta"]`` and the attribute no longer exists, so every model runs with base 10000.

Trigger: any model whose rope_theta is not 10000: Llama-3 (500000), Qwen2/2.5/3 (1000000), Mistral (1000000). The
test model uses 10000, so the proof builds the same tiny Llama with ``rope_theta`` 1000000.
"""
from __future__ import annotations

from deltaserve_core.testing.reference_host import ReferenceHost, _Row  # noqa: F401
import time

import torch

from deltaserve_core.types import ExecutionMode, StepRecord


class Host(ReferenceHost):
    def _rope(self, positions: torch.Tensor, dtype: torch.dtype):
        """The engine's rotary table: (cos, sin) of shape [1, T, head_dim]."""
        base = getattr(self.model.config, "rope_theta", 10000.0)  # BUG: transformers 5 keeps it in rope_parameters
        inv_freq = 1.0 / (base ** (torch.arange(0, self.head_dim, 2, dtype=torch.float32, device=positions.device)
                                   / self.head_dim))
        freqs = positions.float()[:, None] * inv_freq[None, :]
        emb = torch.cat([freqs, freqs], dim=-1)
        return emb.cos()[None].to(dtype), emb.sin()[None].to(dtype)

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
            cos, sin = self._rope(positions, hidden.dtype)  # engine-built rotary tables
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
