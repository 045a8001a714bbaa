"""h28: step() returns a finished request's output again on every later step until a new request is added.

Rule (driver.py, HostDriver.step): "Run at most one engine step ...; return the requests that finished in it."

Bug: the adapter collects finished outputs from the engine's "finished since last add" list, which the engine
clears only when a new request is added; step() hands the same finished requests back on every following step until
the next submit (a caller counting completions, or a server streaming responses, sees each several times;
``generate()`` hides it because it keys outputs by request id).
Trigger: any request that finishes while another is still running (so a further step follows).
"""
from deltaserve_core.testing.reference_host import ReferenceHost


class Host(ReferenceHost):
    def _enqueue(self, request) -> None:
        self._finished_since_add = []
        super()._enqueue(request)

    def step(self):
        outs = super().step()
        prev = getattr(self, "_finished_since_add", [])
        self._finished_since_add = prev + [o for o in outs if o not in prev]
        return prev + [o for o in outs if o not in prev]
