"""Broken host: a client request naming the reserved fine-tuning adapter is served once that adapter is loaded.

Rule (src/deltaserve_core/hooks.py, RESERVED_ADAPTER_NAME): "LoRA adapter name under which fine-tuning rows run.
Hosts must refuse client requests naming it." (also driver.py, check_client_adapter: "What every host's ``submit``
must refuse: the reserved fine-tuning adapter, and adapters it never loaded.")

Bug: ``submit`` validates the adapter with its own "is it loaded?" test against the engine's adapter table, which
also holds the reserved slot after ``set_finetune_adapter``.
Trigger: any client naming ``__deltaserve_finetune__`` once fine-tuning has started.
"""
from deltaserve_core.driver import ClientRequest
from deltaserve_core.testing.reference_host import ReferenceHost


class Host(ReferenceHost):
    name = "blind-h11"

    def submit(self, request: ClientRequest) -> None:
        if request.adapter is not None and request.adapter not in self._adapters:  # BUG: reserved slot is in there
            raise ValueError(f"request {request.request_id!r}: unknown adapter {request.adapter!r}")
        if len(request.prompt_ids) > self.config.max_batch_tokens:
            raise ValueError(f"request {request.request_id!r}: prompt of {len(request.prompt_ids)} tokens exceeds "
                             f"max_batch_tokens={self.config.max_batch_tokens}")
        self._enqueue(request)
