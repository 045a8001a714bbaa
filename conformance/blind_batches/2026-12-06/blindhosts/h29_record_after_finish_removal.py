"""Broken host: the step record's composition leaves out the requests that finished in that step.

Rule (hooks.py, HostHooks.report_step_time): "exactly one :class:`StepRecord` per executed step, in step order, with
the composition that actually ran and its device-complete duration."

Bug: the record is assembled by the output processor from the scheduler's running set after the step's finished
requests were freed: a request that produced its last token in the step is missing from ``num_decode`` /
``kv_tokens`` (or ``prefill_lengths`` when it finished in its prefill step), though it ran. The latency model is
fitted on steps that look smaller than they were.

Trigger: every step in which a client request finishes.
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
    def _execute(self, step_id, rows, tokens, synthetic=False):
        sink, self._step_sink = self._step_sink, None
        try:
            record = super()._execute(step_id, rows, tokens, synthetic)
        finally:
            self._step_sink = sink
        # BUG: composition read from the requests still running after the finished ones were freed
        live = [r for r in rows if r.sample is None and not (r.seq is not None and self._is_done(r.seq))]
        record = replace(
            record,
            prefill_lengths=tuple(r.length for r in live if r.past == 0 and r.fake_kv is None),
            num_decode=sum(1 for r in live if r.past > 0 or r.fake_kv is not None),
            kv_tokens=sum(r.past for r in live if r.past > 0 or r.fake_kv is not None))
        if sink is not None:
            sink(record)
        return record
