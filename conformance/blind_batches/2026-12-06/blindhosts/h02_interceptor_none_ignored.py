"""Broken host: ``intercept_schedule(None)`` does not remove the interceptor.

Rule (hooks.py, HostHooks.intercept_schedule): "Install (or with ``None`` remove) the core's admission callback."

Bug: the adapter's install path was written defensively (``if interceptor is not None:``, so a missing object can
never crash the scheduler's hot path); removing is a no-op. After the core stops (it calls
``intercept_schedule(None)``) the scheduler keeps offering every step to the old interceptor and announcing
arrivals to it, so a stopped job keeps admitting fine-tuning rows.

Trigger: any step or submit after ``intercept_schedule(None)`` (every CoServer stop/shutdown does this).
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
    def intercept_schedule(self, interceptor):
        if interceptor is not None:  # BUG: "never leave the hot path without an interceptor" -- None is ignored
            self._interceptor = interceptor
