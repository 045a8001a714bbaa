"""h01: max_tokens counts only decode-step tokens, so every request gets one token too many.

Rule (driver.py, ClientRequest): "A greedy generation request: ``max_tokens`` new tokens after ``prompt_ids``
(stops early at EOS)."; HostDriver.generate returns what a client received.

Bug: the adapter's stop check compares ``max_tokens`` with the number of *decode* steps the request ran (the token
sampled at the end of its prefill is not counted, as in an engine that counts "generated" tokens from the first
decode on), so a request finishes after ``max_tokens + 1`` tokens.
Trigger: every request (any prompt, any max_tokens).
"""
from deltaserve_core.testing.reference_host import ReferenceHost


class Host(ReferenceHost):
    def _is_done(self, s) -> bool:
        decoded = len(s.output) - 1  # tokens produced by decode steps; the prefill's token is "the first"
        if decoded >= s.request.max_tokens:
            return True
        return bool(s.output) and not s.request.ignore_eos and s.output[-1] in self.eos_ids
