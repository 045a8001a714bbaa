"""Broken host: should_abort is consulted in every step carrying fine-tuning rows, and honoured in mixed steps too.

Rule (src/deltaserve_core/hooks.py, ActivationSink.should_abort): "Called by: the host at every decoder-layer
boundary of a step that carries *only* fine-tuning rows ... Fine-tuning rows that share a step with client rows are
never aborted: they complete with it."

Bug: the worker's abort check tests "does this step carry fine-tuning rows?" instead of "only fine-tuning rows".
In a mixed step an abort stops the fine-tuning rows' captures (the client rows finish the forward) and reports the
samples as aborted.
Trigger: a client request arrives while a step mixing client and fine-tuning rows runs (the core answers
should_abort with True then).
"""
import time

import torch

from deltaserve_core.testing.reference_host import ReferenceHost
from deltaserve_core.types import ExecutionMode, StepRecord


class Host(ReferenceHost):
    name = "blind-h15"

    def _execute(self, step_id, rows, tokens, synthetic=False) -> StepRecord:
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
                sink.begin_step(step_id, [r.sample for r in ft_rows])
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
                # BUG: "carries fine-tuning rows" instead of "carries only fine-tuning rows"
                if capture and not aborted and sink.should_abort(step_id):
                    aborted = True
                    if ft_only:
                        break
                if capture and not aborted:
                    for r in ft_rows:
                        sink.layer_input(step_id, li, r.sample.sample_id, hidden[r.start:r.start + r.length])
                elif synthetic and ft_rows:
                    for r in ft_rows:
                        hidden[r.start:r.start + r.length].clone()
                hidden = self._layer(li, layer, hidden, rows, cos, sin, index)
            if not (aborted and ft_only):
                self._sample(rows, hidden)
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
        duration = time.monotonic() - start
        ft_ids = tuple(r.sample.sample_id for r in ft_rows)
        if capture:
            sink.end_step(step_id, () if aborted else ft_ids, ft_ids if aborted else ())
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
