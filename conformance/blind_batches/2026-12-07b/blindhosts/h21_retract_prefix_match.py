"""retract_adapter unloads every adapter whose name starts with the retracted name.

Rule: hooks.py, HostHooks.retract_adapter: "It withdraws exactly that version: every other name keeps serving its
weights, other versions of the same adapter included"

Bug: the unload path matches adapter names by prefix (``lora_name.startswith(name)``, written to also drop an
adapter's derived entries): retracting ``job@v1`` withdraws ``job@v10`` ... ``job@v19`` and ``job@v100`` too.
Trigger: retracting a version whose name is a prefix of a kept one: with a publish per step and checkpoint.keep >= 9,
pruning ``job@v1`` when ``job@v10`` is published; with versions numbered by optimizer step, ``job@v5`` vs ``job@v50``.
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
    """retract_prefix_match: see the module docstring."""

    def retract_adapter(self, name: str) -> None:
        """Stop serving published version ``name`` (the core prunes old versions): refused from now on, its weights
        kept until the last request submitted on it before has finished."""
        for key in [k for k in self._adapters if k.startswith(name)]:  # BUG: prefix match
            self._withdrawn.hold(key, self._adapters.pop(key))
        self._forget_withdrawn()
