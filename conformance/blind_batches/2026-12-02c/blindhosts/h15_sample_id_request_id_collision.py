"""
h15 - fine-tuning rows are engine requests named ``str(sample_id)``; retiring them finishes a client request of
that id.

Rule (hooks.py, HostHooks.intercept_schedule): the host "adds the returned samples to that same step as
prefill-only rows on the reserved adapter ..., retires them after that one forward, and never lets them reach a
client"; driver.py ClientRequest: "A greedy generation request: ``max_tokens`` new tokens after ``prompt_ids``".

Bug: the adapter injects each sample as an engine request whose id is ``str(sample.sample_id)`` and retires the
rows after the forward with the engine's ``abort_request(ids)``. Engine request ids are one namespace: a client
request whose id is the same string (clients commonly number requests "0", "1", ...) is aborted with them and
returns early with the tokens it had.

Trigger: a client request id equal to the decimal id of a sample injected while it runs.
"""
from __future__ import annotations

from deltaserve_core.testing.reference_host import ReferenceHost


class Host(ReferenceHost):
    def __init__(self, config):
        super().__init__(config)
        self._retired: set[str] = set()

    def _execute(self, step_id, rows, tokens, synthetic=False):
        record = super()._execute(step_id, rows, tokens, synthetic)
        if not synthetic:  # abort_request(str(sample_id) ...) for the injected rows
            self._retired.update(str(r.sample.sample_id) for r in rows if r.sample is not None)
        return record

    def _is_done(self, s):
        if s.request.request_id in self._retired and s.output:
            return True  # aborted by id: finishes with what it has
        return super()._is_done(s)
