"""h05: the checkpoint's generation_config.json repetition_penalty is applied to the clients' greedy requests.

Rule (driver.py, ClientRequest): "A greedy generation request: ``max_tokens`` new tokens after ``prompt_ids``."

Bug: like vLLM's default ``--generation-config auto``, the adapter takes the model's ``generation_config.json`` as
the default sampling parameters and only overrides temperature (0 for greedy). A shipped ``repetition_penalty``
therefore reshapes the logits of every token already in the prompt or output before the argmax.

Trigger: any checkpoint whose generation_config.json sets ``repetition_penalty`` (Qwen2.5-*-Instruct ship 1.05,
Qwen2-Instruct 1.05/1.1, several chat fine-tunes more). The test model ships none, so the proof builds the same tiny
Llama with a generation_config.json holding ``repetition_penalty: 1.3``.
"""
from __future__ import annotations

from deltaserve_core.testing.reference_host import ReferenceHost, _Row  # noqa: F401
import json
import time
from pathlib import Path

import torch


class Host(ReferenceHost):
    def __init__(self, config) -> None:
        super().__init__(config)
        gen = Path(config.model) / "generation_config.json"
        defaults = json.loads(gen.read_text()) if gen.is_file() else {}
        self.repetition_penalty = float(defaults.get("repetition_penalty", 1.0))  # engine default sampling params

    def _sample(self, rows: list[_Row], hidden: torch.Tensor) -> None:
        # Synthetic (calibration) inference rows are sampled too, so profiled steps cost what real ones do.
        inference = [r for r in rows if r.sample is None]
        if not inference:
            return
        last = torch.tensor([r.start + r.length - 1 for r in inference], device=hidden.device)
        logits = self.model.lm_head(self._inner.norm(hidden.index_select(0, last)))
        if self.repetition_penalty != 1.0:  # BUG: the checkpoint's default penalty applied to greedy requests
            for i, r in enumerate(inference):
                if r.seq is not None:
                    seen = torch.tensor(sorted(set(r.seq.request.prompt_ids) | set(r.seq.output)))
                    val = logits[i, seen]
                    logits[i, seen] = torch.where(val > 0, val / self.repetition_penalty,
                                                  val * self.repetition_penalty)
        tokens = logits.argmax(dim=-1).tolist()
        now = time.monotonic()
        for r, tok in zip(inference, tokens):
            if r.seq is not None:
                r.seq.output.append(int(tok))
                r.seq.token_times.append(now)
