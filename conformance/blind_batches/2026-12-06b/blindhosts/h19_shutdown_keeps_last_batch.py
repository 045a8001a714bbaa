"""h19: shutdown() keeps the last step's batch (and its requests' KV) referenced.

Rule (driver.py, HostDriver.shutdown): "The memory the host took for client requests (their KV cache, their queues)
is released once it returned, for the dropped requests too: it never keeps them referenced."

Bug: for asynchronous output processing the adapter keeps the rows of the step in flight (each row holds its
request and, through it, the request's KV cache) until the next step's outputs are processed. shutdown() clears
the waiting and running queues but not that slot, so the last batch's requests and their KV caches stay alive as
long as the host object does.

Trigger: shutdown() after any step that served client requests.
"""
from __future__ import annotations

from deltaserve_core.testing.reference_host import ReferenceHost, _Row  # noqa: F401
from deltaserve_core.types import StepRecord


class Host(ReferenceHost):
    def _execute(self, step_id, rows, tokens, synthetic=False) -> StepRecord:
        self._in_flight_rows = rows  # the batch the async output processor handles one step later
        return super()._execute(step_id, rows, tokens, synthetic)

    def shutdown(self) -> None:
        self._waiting.clear()
        self._running.clear()
        # BUG: self._in_flight_rows (the last batch, with its requests' KV) is never released
