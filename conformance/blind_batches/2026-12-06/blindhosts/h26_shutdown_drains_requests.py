"""Broken host: ``shutdown()`` finishes the pending requests before stopping.

Rule (driver.py, HostDriver.shutdown): "It returns also with client requests pending (they are dropped, never waited
for)."

Bug: the adapter's ``shutdown`` follows the engine's graceful-drain path (like a server's SIGTERM drain): it keeps
stepping until no request is unfinished and only then clears the engine. With long generations pending the call
takes as long as they do (and runs fine-tuning-admitting steps during a stop).

Trigger: ``shutdown()`` while any client request is pending.
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
    def shutdown(self) -> None:
        while self._waiting or self._running:  # BUG: graceful drain
            self.step()
        super().shutdown()
