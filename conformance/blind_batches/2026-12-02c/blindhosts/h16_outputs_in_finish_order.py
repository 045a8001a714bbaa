"""
h16 - generate() returns outputs in the order requests finished, not in request order.

Rule (driver.py, HostDriver.generate): "Submit ``requests`` (all arrive now) and run the engine until every one has
finished. Returns one output per request, in request order."

Bug: the adapter collects outputs as the engine's ``step()`` reports them finished (as ``vllm.LLM`` did before it
sorted by request index) and returns that list.

Trigger: a generate() call whose requests finish in a different order than submitted (different max_tokens).
"""
from __future__ import annotations

from deltaserve_core.testing.reference_host import ReferenceHost


class Host(ReferenceHost):
    def generate(self, requests):
        for r in requests:
            self.submit(r)
        wanted = {r.request_id for r in requests}
        done = []
        while len(done) < len(wanted):
            if not self.has_unfinished():
                raise RuntimeError("the engine has no work left but some requests never finished")
            done.extend(o for o in self.step() if o.request_id in wanted)
        return done  # finish order
