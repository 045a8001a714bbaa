"""submit() never calls on_arrival."""
import time

from deltaserve_core.driver import check_client_adapter
from deltaserve_core.testing.reference_host import _Seq

from ._base import Patchable


class Host(Patchable):
    name = "blind-h38"

    def submit(self, request):
        check_client_adapter(request, self._adapters)
        if len(request.prompt_ids) > self.config.max_batch_tokens:
            raise ValueError("prompt too long")
        with self._lock:
            self._waiting.append(_Seq(request, time.monotonic()))  # BUG: no on_arrival
