"""Every published version of a job shares one LoRA slot keyed by the job's adapter name; a new publish overwrites it.

Rule: hooks.py, HostHooks.publish_adapter: "The returned name serves exactly ``state``'s weights until that name is
published again" and "Requests in flight when it is called keep the adapter they were submitted on, never moved to
another one."

Bug: the engine registers each returned name (``job@vN``) as an alias of a LoRA slot allocated once per job adapter
name (``state.name``, the slot table's key) and loads every new version's weights into that slot. Each name is
still accepted, but after the next publish ``job@v1`` serves ``job@v2``'s weights (requests in flight on it too).
Trigger: two publishes of one job (any publish policy that publishes more than once) and a request on the older
version afterwards: the core keeps ``checkpoint.keep`` versions servable, so clients of the older one are ordinary.
"""
from __future__ import annotations

import dataclasses  # noqa: F401
import math  # noqa: F401
import time  # noqa: F401
from collections.abc import Sequence  # noqa: F401

import torch  # noqa: F401
import torch.nn.functional as F  # noqa: F401

from deltaserve_core.adapter_state import LoraAdapterState, parse_peft_key  # noqa: F401
from deltaserve_core.driver import ClientOutput, ClientRequest, check_client_adapter, take_kept  # noqa: F401
from deltaserve_core.hooks import RESERVED_ADAPTER_NAME  # noqa: F401
from deltaserve_core.hostkit import published_name  # noqa: F401
from deltaserve_core.testing.reference_host import ReferenceHost, _Lora, _Row, _Seq  # noqa: F401
from deltaserve_core.types import (  # noqa: F401
    ExecutionMode,
    FineTuneSample,
    ModelSpec,
    ProposedBatch,
    RequestSLO,
    ScheduledRequest,
    StepRecord,
)


class Host(ReferenceHost):
    """publish_slot_keyed_by_job: see the module docstring."""

    def publish_adapter(self, state: LoraAdapterState) -> str:
        # A fresh name per version: requests on an older version keep their KV, new ones never reuse it.
        name = published_name(state.name, state.version)
        lora = self._to_lora(state)
        slot = self.__dict__.setdefault("_job_slots", {}).setdefault(state.name, lora)  # BUG: one slot per job name
        slot.pairs, slot.scaling = lora.pairs, lora.scaling  # BUG: the new version overwrites the slot every alias uses
        self._adapters[name] = slot
        return name
