"""h23: the EOS token that stops a request gets no time in ClientOutput.token_times.

Rule (driver.py, ClientOutput): "``token_times``, when given, holds exactly one time per token of ``token_ids``, in
order and non-decreasing, the first equal to ``first_token_time`` and the last to ``finish_time``."

Bug: token times are stamped when the detokenizer emits a text delta; a stop token (EOS with ``ignore_eos=False``)
produces none, so it gets no time while it stays in ``token_ids`` (as the contract requires). The output then has
one time fewer than tokens and its finish_time is the previous token's time.

Trigger: every request with ``ignore_eos=False`` that stops at EOS (any chat request).
"""
from __future__ import annotations

from deltaserve_core.testing.reference_host import ReferenceHost, _Row  # noqa: F401
import time

import torch


class Host(ReferenceHost):
    def _sample(self, rows: list[_Row], hidden: torch.Tensor) -> None:
        # Synthetic (calibration) inference rows are sampled too, so profiled steps cost what real ones do.
        inference = [r for r in rows if r.sample is None]
        if not inference:
            return
        last = torch.tensor([r.start + r.length - 1 for r in inference], device=hidden.device)
        logits = self.model.lm_head(self._inner.norm(hidden.index_select(0, last)))
        tokens = logits.argmax(dim=-1).tolist()
        now = time.monotonic()
        for r, tok in zip(inference, tokens):
            if r.seq is not None:
                r.seq.output.append(int(tok))
                if r.seq.request.ignore_eos or int(tok) not in self.eos_ids:  # BUG: a stop token has no text delta,
                    r.seq.token_times.append(now)  # so it is never stamped
