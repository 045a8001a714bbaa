"""Broken host: a published adapter serves the caller's tensors, not a copy.

Rule (hooks.py, HostHooks.publish_adapter): "The returned name serves exactly ``state``'s weights until that name is
published again: never those of a later :meth:`set_finetune_adapter` (the host keeps its own copy)".

Bug: publishing moves the state's A/B to the engine's device and dtype with ``.to(device, dtype)`` and no
``copy=True``: on a host where they already match (CPU, float32 here; CUDA when the core hands CUDA tensors) the
served LoRA slot *is* the caller's tensors. Whatever the caller later does to them (the training loop's in-place
updates of a snapshot it reuses, zeroing a buffer it recycles) changes what the published name serves. (The
reserved fine-tuning adapter is copied correctly.)

Trigger: any change to the published state's tensors after ``publish_adapter`` returned.
"""
from __future__ import annotations

import time  # noqa: F401
from collections.abc import Sequence  # noqa: F401
from dataclasses import replace  # noqa: F401

import torch  # noqa: F401
import torch.nn.functional as F  # noqa: F401

from deltaserve_core.driver import ClientOutput  # noqa: F401
from deltaserve_core.hooks import RESERVED_ADAPTER_NAME  # noqa: F401
from deltaserve_core.testing.reference_host import ReferenceHost, _Lora, _Row, _Seq  # noqa: F401
from deltaserve_core.types import ExecutionMode, FineTuneSample, ProposedBatch, StepRecord  # noqa: F401
from deltaserve_core.adapter_state import parse_peft_key
from deltaserve_core.hostkit import published_name



class Host(ReferenceHost):
    def publish_adapter(self, state) -> str:
        name = published_name(state.name, state.version)
        self._adapters[name] = self._to_lora_for_serving(state)
        return name

    def _to_lora_for_serving(self, state: LoraAdapterState) -> _Lora:
        pairs: dict[tuple[int, str], tuple[torch.Tensor, torch.Tensor]] = {}
        for key, tensor in state.tensors.items():
            layer, module, ab = parse_peft_key(key)
            if ab != "A":
                continue
            b = state.tensors[key[: -len("A.weight")] + "B.weight"]
            if tensor.shape[0] > self.config.max_lora_rank:
                raise ValueError(f"adapter {state.name!r} has rank {tensor.shape[0]} > max_lora_rank="
                                 f"{self.config.max_lora_rank}; raise HostConfig.max_lora_rank")
            # Copies: the core may keep training the tensors it handed over; the host serves this snapshot.
            # BUG: no copy=True: a no-op move when device and dtype already match, so the slot aliases `state`
            pairs[(layer, module)] = (tensor.detach().to(self.device, self.dtype),
                                      b.detach().to(self.device, self.dtype))
        return _Lora(state.config.scaling, pairs)
