"""Freeing a retracted version unloads its name: a version published again under that name meanwhile is unloaded too.

Rule: hooks.py, HostHooks.publish_adapter: "The returned name serves exactly ``state``'s weights until that name is published again" and "a second publish of the same name and version (a restarted job redoing a step) replaces them" /
hooks.py, HostHooks.retract_adapter: "It withdraws exactly that version"

Bug: when the last request on a withdrawn version finishes, the host frees it with the engine's ``remove_lora(name)``,
which unloads whatever is registered under that name: if the version was published again in between (a job restarted
from an older checkpoint redoes its steps and republishes ``job@vN``), the new one is unloaded and requests on it are
refused as unknown. Retractions without a republish are exact.
Trigger: a version retracted while a request on it runs, published again before that request finishes.
"""
from __future__ import annotations

import dataclasses  # noqa: F401
import math  # noqa: F401
import time  # noqa: F401
from collections.abc import Sequence  # noqa: F401

import torch  # noqa: F401
import torch.nn.functional as F  # noqa: F401

from deltaserve_core.adapter_state import LoraAdapterState, parse_peft_key  # noqa: F401
from deltaserve_core.driver import ClientOutput, ClientRequest, check_client_adapter, run_to_completion, take_kept  # noqa: F401
from deltaserve_core.hooks import RESERVED_ADAPTER_NAME  # noqa: F401
from deltaserve_core.hostkit import profile_seed, published_name  # noqa: F401
from deltaserve_core.testing.reference_host import ReferenceHost, _as_list, _Lora, _Row, _Seq  # noqa: F401
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
    """republish_unloaded_on_release: see the module docstring."""

    def retract_adapter(self, name: str) -> None:
        """Stop serving published version ``name`` (the core prunes old versions): refused from now on, its weights
        kept until the last request submitted on it before has finished."""
        lora = self._adapters.pop(name, None)
        if lora is not None:
            self._withdrawn.hold(name, lora)
            self.__dict__.setdefault("_held_names", set()).add(name)  # plumbing: names of held versions
            self._forget_withdrawn()

    def _forget_withdrawn(self) -> None:
        with self._lock:
            unfinished = [s.request for s in self._waiting]
        self._withdrawn.release(unfinished + [s.request for s in self._running])
        held = self.__dict__.get("_held_names", set())
        for name in [n for n in held if n not in self._withdrawn]:  # BUG: freeing unloads by name
            held.discard(name)
            self._adapters.pop(name, None)
