"""Adapter names are resolved case-insensitively (OpenAI-style model names); the reserved-name refusal compares the
exact spelling first, so '__DeltaServe_Finetune__' reaches the fine-tuning adapter."""
import dataclasses
import time

from deltaserve_core.hooks import ReservedAdapterError
from deltaserve_core.testing.reference_host import _Seq

from ._base import RESERVED_ADAPTER_NAME, Patchable


class Host(Patchable):
    name = "blind-h15"

    def submit(self, request):
        if request.adapter == RESERVED_ADAPTER_NAME:  # BUG: exact spelling only
            raise ReservedAdapterError(request.adapter)
        if request.adapter is not None:
            match = [n for n in self._adapters if n.casefold() == request.adapter.casefold()]
            if not match:
                raise ValueError(f"request {request.request_id!r}: unknown adapter {request.adapter!r}")
            request = dataclasses.replace(request, adapter=match[0])
        if len(request.prompt_ids) > self.config.max_batch_tokens:
            raise ValueError("prompt too long")
        now = time.monotonic()
        with self._lock:
            self._waiting.append(_Seq(request, now))
        if self._interceptor is not None:
            self._interceptor.on_arrival(request.request_id, now)
