"""h17: calibration's throw-away prefill requests stay queued in the engine after the profile step.

Rule (hooks.py, HostHooks.run_profile_step): "Execute one synthetic step of ``shape`` ... Synthetic rows never
reach a client." (types.py, ProfileShape: "The host builds throw-away requests of these shapes").

Bug: the adapter adds the profile shape's prefill requests to the engine's queue (ids ``__profile-<step>-<i>``)
to run them through the normal path, but only removes them from the batch it ran, not from the request queue: after
calibration each one is scheduled again as a client request, generates, and comes out of ``step()`` as a client
output (and ``has_unfinished()`` stays true, so no idle step is offered until they finish).
Trigger: any calibration shape with prefill rows (calibration runs before the first client request).
"""
from deltaserve_core.driver import ClientRequest
from deltaserve_core.hostkit import ProfileDraw
from deltaserve_core.testing.reference_host import ReferenceHost, _Seq


class Host(ReferenceHost):
    def run_profile_step(self, shape):
        record = super().run_profile_step(shape)
        draw = ProfileDraw(shape, self.model.config.vocab_size)
        with self._lock:
            for i, n in enumerate(shape.prefill_lengths):
                req = ClientRequest(f"__profile-{record.step_id}-{i}", tuple(draw.tokens(n)), max_tokens=1)
                self._waiting.append(_Seq(req, record.start_time))
        return record
