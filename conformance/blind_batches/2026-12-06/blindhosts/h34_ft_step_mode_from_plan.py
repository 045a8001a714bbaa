"""Broken host (CUDA-graph model): a step with fine-tuning rows is recorded in the mode proposed for its client rows.

Rule (hooks.py, HostHooks.report_step_time): "exactly one :class:`StepRecord` per executed step, in step order, with
the composition that actually ran"; (types.py, ExecutionMode): "``GRAPH`` is a replay of a captured CUDA graph (or any
other pre-recorded execution in which Python hooks do not fire); ``EAGER`` dispatches kernels one by one and runs
module hooks."

Bug: the runner correctly falls back to eager for a step carrying fine-tuning rows (the captures fire), but the
record's ``mode`` is copied from the step plan, i.e. the mode proposed for the client rows (GRAPH for a small
decode batch). The core fits such steps, which ran eagerly with captures, into its GRAPH coefficients.

Trigger: fine-tuning rows admitted into a decode-only step of at most 8 requests (light load).
Base: ``_graphs.GraphHost`` (correct).
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
from blindhosts._graphs import GraphHost



class Host(GraphHost):
    def _execute(self, step_id, rows, tokens, synthetic=False):
        client = [r for r in rows if r.sample is None]
        if synthetic or not client or len(client) == len(rows):
            return super()._execute(step_id, rows, tokens, synthetic)
        planned = self._run_mode(client, synthetic)  # the mode proposed for the batch's client rows
        sink, self._step_sink = self._step_sink, None
        try:
            record = super()._execute(step_id, rows, tokens, synthetic)  # runs eagerly: captures fire
        finally:
            self._step_sink = sink
        record = replace(record, mode=planned)  # BUG: the plan's mode, not the mode that ran
        if sink is not None:
            sink(record)
        return record
