"""
h08 - on_arrival is called twice per request: when it is submitted and when it is first scheduled.

Rule (hooks.py, ScheduleInterceptor.on_arrival): "Called by: the host, from whichever thread accepts requests ...
once per client request." and HostHooks.intercept_schedule: "It calls ``interceptor.on_arrival`` for each client
request."

Bug: the adapter hooks both the engine's ``add_request`` (front end) and the scheduler's "new request" path
(``_update_waiting_for_remote_kv``/``add_request`` of the scheduler subclass) and both announce the arrival: every
request is announced a second time, with the same arrival time, in the step that admits it.

Trigger: every client request.
"""
from __future__ import annotations

from deltaserve_core.testing.reference_host import ReferenceHost


class Host(ReferenceHost):
    def _schedule(self):
        prefills, decodes, left = super()._schedule()
        if self._interceptor is not None:
            for seq in prefills:  # the scheduler subclass's own "new request" announcement
                self._interceptor.on_arrival(seq.request.request_id, seq.arrival_time)
        return prefills, decodes, left
