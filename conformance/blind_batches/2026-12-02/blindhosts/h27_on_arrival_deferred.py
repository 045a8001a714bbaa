"""on_arrival is called from the scheduler when it drains new requests (vLLM add_request in EngineCore), not from
the thread that accepts them: a request arriving during a step is announced only at the next schedule."""
import time

from deltaserve_core.driver import check_client_adapter
from deltaserve_core.testing.reference_host import _Seq

from ._base import Patchable


class Host(Patchable):
    name = "blind-h27"

    def submit(self, request):
        check_client_adapter(request, self._adapters)
        if len(request.prompt_ids) > self.config.max_batch_tokens:
            raise ValueError("prompt too long")
        now = time.monotonic()
        with self._lock:
            self._waiting.append(_Seq(request, now))
            self.__dict__.setdefault("_unannounced", []).append((request.request_id, now))  # BUG: deferred

    def _schedule(self):
        with self._lock:
            pending, self._unannounced = list(self.__dict__.get("_unannounced", [])), []
        if self._interceptor is not None:
            for rid, t in pending:
                self._interceptor.on_arrival(rid, t)
        return super()._schedule()
