"""h16: generate() runs the engine until it is empty and drops outputs of requests it was not given.

Rule (driver.py, HostDriver.has_unfinished): "Whether any submitted client request has not finished. [...] it is
False once every client request has been returned [...] a request is unfinished from ``submit`` until its output is
returned".

Bug: generate() is written like vLLM's ``LLM._run_engine``: ``while has_unfinished(): step()`` keeping the outputs of
its own requests. A request submit()ted earlier that finishes meanwhile is consumed by that loop and never returned
by any call, and has_unfinished() then says False: the request is lost to its client.

Trigger: a generate() call while a submit()ted request is still running (mixing both client paths).
"""
from __future__ import annotations

from deltaserve_core.testing.reference_host import ReferenceHost, _Row  # noqa: F401


class Host(ReferenceHost):
    def generate(self, requests):
        for r in requests:
            self.submit(r)
        wanted = {r.request_id for r in requests}
        got = {}
        while self.has_unfinished():  # BUG: runs the engine dry; other requests' outputs are dropped
            got.update((o.request_id, o) for o in self.step() if o.request_id in wanted)
        return [got[r.request_id] for r in requests]
