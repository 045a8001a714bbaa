"""Broken host: calibration steps report no KV tokens for their decode rows.

Rule (hooks.py, HostHooks.report_step_time): "exactly one :class:`StepRecord` per executed step, in step order, with
the composition that actually ran"; (hooks.py, HostHooks.run_profile_step): "Execute one synthetic step of ``shape``
through the host's normal path and return its record." (types.py, ProfileShape: "a decode batch with its KV length").

Bug: calibration's decode rows are throw-away 1-token requests attached to a dummy KV of ``decode_context`` tokens
(a fake block table). The record's KV term is computed from the requests' computed-token counters, which are 0 for
those dummies: ``kv_tokens`` is 0 although every decode row attended over ``decode_context`` tokens. The latency
model is then fitted with the KV term of every decode shape missing.

Trigger: any calibration shape with decode rows (``num_decode > 0``, ``decode_context > 0``): every calibration.
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
    def run_profile_step(self, shape):
        sink, self._step_sink = self._step_sink, None
        try:
            record = super().run_profile_step(shape)
        finally:
            self._step_sink = sink
        # BUG: KV from the dummy requests' computed-token counters (0), not the context they attended over
        record = replace(record, kv_tokens=0)
        if sink is not None:
            sink(record)
        return record
