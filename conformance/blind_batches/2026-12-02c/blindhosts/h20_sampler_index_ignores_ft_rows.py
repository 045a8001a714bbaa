"""
h20 - fine-tuning rows are placed first in the step and the sampler's last-token indices ignore their offset.

Rule (hooks.py, HostHooks.intercept_schedule): the host adds the samples "as prefill-only rows on the reserved
adapter (no prefix-cache reads, no sampling output) ... and never lets them reach a client" -- and the step's
client rows must be sampled exactly as without them (driver.py ClientRequest: greedy tokens after ``prompt_ids``).

Bug: the adapter puts the injected rows at the front of the flattened batch (so its capture hook can slice
``hidden[:n_ft]``), and builds the sampler's ``logits_indices`` from the scheduler's own ``query_start_loc``, which
knows only client rows and starts at 0. Client rows are then sampled from hidden states shifted by the number of
fine-tuning tokens (a fine-tuning row's hidden state, or another client's).

Trigger: any step that carries client rows and fine-tuning rows.
"""
from __future__ import annotations

import time

import torch

from deltaserve_core.testing.reference_host import ReferenceHost, _Row


class Host(ReferenceHost):
    def _execute(self, step_id, rows, tokens, synthetic=False):
        ordered = [r for r in rows if r.sample is not None] + [r for r in rows if r.sample is None]
        new_rows, parts, pos = [], [], 0
        for r in ordered:  # injected rows first
            parts.append(tokens[r.start:r.start + r.length])
            new_rows.append(_Row(pos, r.length, r.adapter, seq=r.seq, sample=r.sample, past=r.past, fake_kv=r.fake_kv))
            pos += r.length
        return super()._execute(step_id, new_rows, torch.cat(parts) if parts else tokens, synthetic)

    def _sample(self, rows, hidden):
        inference = [r for r in rows if r.sample is None]
        if not inference:
            return
        # logits_indices from the scheduler's query_start_loc: client rows only, starting at 0
        last = torch.cumsum(torch.tensor([r.length for r in inference]), 0) - 1
        logits = self.model.lm_head(self._inner.norm(hidden.index_select(0, last.to(hidden.device))))
        now = time.monotonic()
        for r, tok in zip(inference, logits.argmax(dim=-1).tolist()):
            if r.seq is not None:
                r.seq.output.append(int(tok))
                r.seq.token_times.append(now)
