"""h21: requests on a client LoRA adapter are sampled at the engine's default temperature, not greedily.

Rule (driver.py, ClientRequest): "A greedy generation request" (HostDriver.generate: the outputs of greedy
decoding), whatever adapter the request names.

Bug: the adapter builds sampling parameters in two places; the path for requests carrying a LoRA request creates
``SamplingParams(max_tokens=...)`` without ``temperature=0.0``, so the engine's default temperature 1.0 applies and
those requests are sampled (seeded, so reproducible) instead of decoded greedily.
Trigger: any request naming a client adapter.
"""
import torch

from deltaserve_core.testing.reference_host import ReferenceHost


class Host(ReferenceHost):
    def _sample(self, rows, hidden) -> None:
        import time

        inference = [r for r in rows if r.sample is None]
        if not inference:
            return
        if not hasattr(self, "_gen"):
            self._gen = torch.Generator().manual_seed(self.config.seed)
        last = torch.tensor([r.start + r.length - 1 for r in inference], device=hidden.device)
        logits = self.model.lm_head(self._inner.norm(hidden.index_select(0, last))).float().cpu()
        now = time.monotonic()
        for r, row in zip(inference, logits):
            if r.seq is not None and r.adapter is not None:
                tok = int(torch.multinomial(torch.softmax(row, -1), 1, generator=self._gen))
            else:
                tok = int(row.argmax())
            if r.seq is not None:
                r.seq.output.append(tok)
                r.seq.token_times.append(now)
