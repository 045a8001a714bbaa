"""
h31 - fine-tuning rows write their KV into a token-keyed prefix cache that client prefills then read.

Rule (hooks.py, HostHooks.intercept_schedule): the host adds the samples "as prefill-only rows on the reserved
adapter (no prefix-cache reads, no sampling output), retires them after that one forward, and never lets them
reach a client."

Bug: the engine's prefix cache (16-token blocks) is keyed by token ids only -- the adapter did not fold the LoRA
into the block hash (SGLang's radix cache before ``lora_id`` was part of the key; vLLM with a missing
``extra_keys``). Fine-tuning rows do not *read* the cache, but their KV blocks are inserted into it after the
forward like any prefill's. A later client prompt that starts with the same tokens as a training sample (same
system prompt / instruction template as the training data) reuses those blocks: its first tokens' KV was computed
with the fine-tuning adapter, not with the client's weights.

Trigger: a client prompt sharing a prefix of 16+ tokens with a fine-tuning sample that ran before it.
"""
from __future__ import annotations

import dataclasses

import torch

from deltaserve_core.driver import ClientRequest
from deltaserve_core.testing.reference_host import ReferenceHost, _Row, _Seq

_BLOCK = 16


class Host(ReferenceHost):
    def __init__(self, config):
        super().__init__(config)
        self._prefix_cache: list[tuple[tuple[int, ...], list]] = []  # (token ids, per-layer (k, v))

    def _lookup(self, prompt):
        best = (0, None)
        for ids, kv in self._prefix_cache:
            n = 0
            for a, b in zip(ids, prompt):
                if a != b:
                    break
                n += 1
            h = (min(n, len(prompt) - 1) // _BLOCK) * _BLOCK  # whole blocks, at least one token left to compute
            if h > best[0]:
                best = (h, kv)
        return best

    def _execute(self, step_id, rows, tokens, synthetic=False):
        if synthetic:
            return super()._execute(step_id, rows, tokens, synthetic)
        new_rows, parts, pos, holders, hits = [], [], 0, [], []
        for r in rows:
            seg, past, seq = tokens[r.start:r.start + r.length], r.past, r.seq
            if seq is not None and r.past == 0 and seq.kv is None:  # client prefill: prefix-cache lookup
                h, kv = self._lookup(seq.request.prompt_ids)
                if h:
                    seq.kv = [(k[:, :h].clone(), v[:, :h].clone()) for k, v in kv]
                    seg, past = seg[h:], h
                    hits.append(len(new_rows))
            if r.sample is not None:  # KV of the injected row is kept for the cache insert
                seq = _Seq(ClientRequest(f"ft-{r.sample.sample_id}", r.sample.input_ids, 1), 0.0)
                holders.append((r.sample.input_ids, seq))
            new_rows.append(_Row(pos, len(seg), r.adapter, seq=seq, sample=r.sample, past=past, fake_kv=r.fake_kv))
            parts.append(seg)
            pos += len(seg)
        sink, self._step_sink = self._step_sink, None
        try:
            record = super()._execute(step_id, new_rows, torch.cat(parts), synthetic)
        finally:
            self._step_sink = sink
        for ids, seq in holders:  # blocks of every prefill are inserted, keyed by tokens only
            self._prefix_cache.append((tuple(ids), seq.kv))
        if hits:  # a cached prefill is still a prefill of the tokens it computed
            client = [r for r in new_rows if r.sample is None]
            record = dataclasses.replace(
                record,
                prefill_lengths=tuple(r.length for i, r in enumerate(new_rows)
                                      if r.sample is None and (r.past == 0 or i in hits)),
                num_decode=sum(1 for i, r in enumerate(new_rows) if r.sample is None and r.past > 0 and i not in hits),
                kv_tokens=sum(r.past for i, r in enumerate(new_rows) if r.sample is None and r.past > 0
                              and i not in hits))
            del client
        if sink is not None:
            sink(record)
        return record
