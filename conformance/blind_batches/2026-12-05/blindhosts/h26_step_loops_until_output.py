"""h26: step() keeps stepping the engine until some request finishes.

Rule (driver.py, HostDriver.step): "Run at most one engine step (or, for engines with their own loop, wait for the
next one); return the requests that finished in it."

Bug: the engine's ``step()`` usually returns no finished request, so the adapter's ``step()`` loops over engine
steps until it has something to return (or no work is left), as a blocking ``generate`` loop does. A single call runs
a whole request to completion.

Trigger: any ``step()`` while a request needs more than one step (max_tokens >= 2).
"""
from __future__ import annotations

from deltaserve_core.testing.reference_host import ReferenceHost


class Host(ReferenceHost):
    def step(self):
        while True:
            outputs = super().step()
            if outputs or not self.has_unfinished():
                return outputs
