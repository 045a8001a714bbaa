"""h06: generate() adds its requests through the engine's bulk path, which never calls on_arrival.

Rule (hooks.py, ScheduleInterceptor.on_arrival): "Called by: the host, from whichever thread accepts requests (it
may run while a step executes), once per client request."

Bug: ``submit`` notifies the interceptor, but ``generate`` validates its requests and appends them to the waiting
queue in one go (vLLM's ``LLM._add_requests`` / a batch ``add_requests``), bypassing the single-request path where
the arrival hook was installed. Requests sent through ``generate`` are served but never announced.

Trigger: any ``generate()`` call.
"""
from __future__ import annotations

import time

from deltaserve_core.driver import check_client_adapter
from deltaserve_core.testing.reference_host import ReferenceHost, _Seq


class Host(ReferenceHost):
    def generate(self, requests):
        for r in requests:
            check_client_adapter(r, self._adapters)
            if len(r.prompt_ids) > self.config.max_batch_tokens:
                raise ValueError(f"request {r.request_id!r}: prompt exceeds max_batch_tokens")
        now = time.monotonic()
        with self._lock:
            self._waiting.extend(_Seq(r, now) for r in requests)
        wanted = {r.request_id for r in requests}
        got = {}
        while len(got) < len(wanted):
            if not self.has_unfinished():
                raise RuntimeError(f"requests {sorted(wanted - set(got))} never finished")
            got.update((o.request_id, o) for o in self.step() if o.request_id in wanted)
        return [got[r.request_id] for r in requests]
