"""generate() validates adapters against the client adapters the engine was started with: published versions are
refused there.

Rule: hooks.py, HostHooks.publish_adapter: "Clients must be able to request the returned name exactly as returned,
whatever the job's adapter name holds" / driver.py, HostDriver.generate: "Submit ``requests`` (all arrive now) and
run the engine until every one has finished."

Bug: the offline generate() path checks each request's adapter against the static adapter list of the start-up
configuration (``HostConfig.client_adapters``, vLLM's ``--lora-modules``) before submitting; adapters loaded at run
time (every published version) are refused as unknown there, while submit() serves them.
Trigger: generate() with a request on a published version (a client of the job's latest adapter using the batch
API).
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
from deltaserve_core.hostkit import published_name  # noqa: F401
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
    """generate_checks_static_adapters: see the module docstring."""

    def generate(self, requests: Sequence[ClientRequest]) -> list[ClientOutput]:
        for r in requests:  # BUG: validated against the adapters the engine was started with
            check_client_adapter(r, self.config.client_adapters)
        return run_to_completion(self, requests, self._kept)
