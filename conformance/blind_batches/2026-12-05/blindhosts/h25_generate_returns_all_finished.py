"""h25: generate() returns every output that finished while it ran, not one per request it was given.

Rule (driver.py, HostDriver.generate): "Returns exactly one output per request, in request order, never in the order
they finished (callers pair outputs with requests by position)."

Bug: like vLLM's ``LLM._run_engine``, the driver drains the engine and returns every finished output it collected,
ordered by submission: requests submitted earlier through ``submit()`` that finish meanwhile come back too, ahead of
the ones passed to ``generate``.

Trigger: ``generate()`` while a request submitted earlier with ``submit()`` is still unfinished.
"""
from __future__ import annotations

from deltaserve_core.testing.reference_host import ReferenceHost


class Host(ReferenceHost):
    def generate(self, requests):
        order = {}
        for s in list(self._running) + list(self._waiting):
            order.setdefault(s.request.request_id, len(order))
        for r in requests:
            self.submit(r)
            order.setdefault(r.request_id, len(order))
        wanted = {r.request_id for r in requests}
        got = {}
        while not wanted <= set(got):
            if not self.has_unfinished():
                raise RuntimeError(f"requests {sorted(wanted - set(got))} never finished")
            got.update((o.request_id, o) for o in self.step())
        return sorted(got.values(), key=lambda o: order.get(o.request_id, len(order)))
