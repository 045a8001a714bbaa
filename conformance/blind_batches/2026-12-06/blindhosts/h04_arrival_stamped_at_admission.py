"""Broken host: a request's arrival time is stamped when the scheduler admits it, not when it was submitted.

Rule (driver.py, ClientOutput): "``arrival_time`` is when ``submit`` (or ``generate``) accepted the request, never when
the engine first scheduled it (the TTFT a client sees includes its time in the queue)."

Bug: the front end passes the request to the engine without a timestamp (``on_arrival`` gets the front end's clock);
the engine's request object takes ``arrival_time = time.monotonic()`` when the scheduler first moves it from the
waiting queue into a step. ``ClientOutput.arrival_time`` (and the ``ScheduledRequest`` views once it runs) carry the
admission time, so queueing time vanishes from every TTFT.

Trigger: any request, worst under load (more requests than ``max_running_requests`` slots: the queued ones wait
whole steps before admission).
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
    def _schedule(self):
        prefills, decodes, left = super()._schedule()
        now = time.monotonic()
        for seq in prefills:
            seq.arrival_time = now  # BUG: the engine request's arrival is stamped on admission
        return prefills, decodes, left
