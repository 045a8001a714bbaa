"""h17: submit accepts an adapter name the host never loaded; the request is served on the base model.

Rule (driver.py, check_client_adapter): "What every host's ``submit`` must refuse: the reserved fine-tuning adapter,
and adapters it never loaded."

Bug: adapter names are resolved lazily, at schedule time (SGLang-style ``lora_path`` lookup), so submit only checks
the reserved name; at schedule time an unknown name finds no LoRA slot and its rows run with index -1: the base
model. The client gets base-model tokens for a request on a fine-tuned adapter, with no error.

Trigger: a client naming a version that is not (or no longer) loaded: an old ``job@vN`` after the core pruned it, or
a newer one not published yet.
"""
from __future__ import annotations

from deltaserve_core.testing.reference_host import ReferenceHost, _Row  # noqa: F401
import torch

from deltaserve_core.hooks import RESERVED_ADAPTER_NAME, ReservedAdapterError


class Host(ReferenceHost):
    def submit(self, request: ClientRequest) -> None:
        if request.adapter == RESERVED_ADAPTER_NAME:  # BUG: unknown names are not refused (resolved at schedule time)
            raise ReservedAdapterError(request.adapter)
        if len(request.prompt_ids) > self.config.max_batch_tokens:
            raise ValueError(f"request {request.request_id!r}: prompt of {len(request.prompt_ids)} tokens exceeds "
                             f"max_batch_tokens={self.config.max_batch_tokens}; raise it in HostConfig")
        self._enqueue(request)

    def _linear(self, x: torch.Tensor, module: torch.nn.Module, layer: int, name: str,
                groups: dict[str, torch.Tensor]) -> torch.Tensor:
        out = module(x)
        for adapter, index in groups.items():
            lora = self._adapters.get(adapter)
            if lora is None:  # BUG: an unresolved adapter gets LoRA index -1, i.e. the base model
                continue
            pair = lora.pairs.get((layer, name))
            if pair is None:
                continue
            a, b = pair
            # Same order of operations as PEFT's LoRA layer: B(A(x)) * scaling, added to the base output.
            out.index_add_(0, index, (x.index_select(0, index) @ a.T @ b.T) * lora.scaling)
        return out
