"""Broken host: ``generate()`` accepts requests on the reserved fine-tuning adapter.

Rule (hooks.py, RESERVED_ADAPTER_NAME): "LoRA adapter name under which fine-tuning rows run. Hosts must refuse client
requests naming it." (driver.py, check_client_adapter: "What every host's ``submit`` must refuse: the reserved
fine-tuning adapter, and adapters it never loaded.")

Bug: ``generate`` validates its batch up front with a hand-written "is the adapter loaded?" test (so a bad request
fails the call before anything is enqueued) and then enqueues through the engine directly; once
``set_finetune_adapter`` loaded the reserved adapter, a request naming it passes and is served on the live training
weights. ``submit`` uses ``check_client_adapter`` and is right.

Trigger: ``generate`` with a request naming ``__deltaserve_finetune__`` after the first ``set_finetune_adapter``.
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



class Host(ReferenceHost):
    def generate(self, requests):
        for r in requests:
            if r.adapter is not None and r.adapter not in self._adapters:  # BUG: the reserved name is "loaded"
                raise ValueError(f"request {r.request_id!r}: unknown adapter {r.adapter!r}")
            if len(r.prompt_ids) > self.config.max_batch_tokens:
                raise ValueError(f"request {r.request_id!r}: prompt exceeds max_batch_tokens")
        for r in requests:
            self._enqueue(r)
        wanted = {r.request_id for r in requests}
        got = {}
        while len(got) < len(wanted):
            if not self.has_unfinished():
                raise RuntimeError(f"the engine has no work left but requests {sorted(wanted - set(got))} never finished")
            got.update((o.request_id, o) for o in self.step() if o.request_id in wanted)
        return [got[r.request_id] for r in requests]
