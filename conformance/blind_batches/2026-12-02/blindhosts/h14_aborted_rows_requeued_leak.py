"""Aborted fine-tuning rows are 'resumed': re-queued as internal requests on the reserved adapter. They then run as
ordinary requests, sample a token, and come back from step() as ClientOutputs."""
import time

from deltaserve_core.driver import ClientRequest
from deltaserve_core.testing.reference_host import _Seq

from ._base import RESERVED_ADAPTER_NAME, Patchable


class Host(Patchable):
    name = "blind-h14"

    def _after_record(self, record, rows, ft_rows, aborted):
        if aborted and not record.synthetic:
            for r in ft_rows:  # BUG: re-queued through the client path
                req = ClientRequest(f"ft-{r.sample.sample_id}", tuple(r.sample.input_ids), 1,
                                    adapter=RESERVED_ADAPTER_NAME)
                with self._lock:
                    self._waiting.appendleft(_Seq(req, time.monotonic()))
