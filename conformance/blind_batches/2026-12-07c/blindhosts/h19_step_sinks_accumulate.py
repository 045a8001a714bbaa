"""report_step_time appends the sink to a list of stat loggers: a replaced sink keeps receiving records.

Rule: hooks.py, HostHooks.report_step_time: "Install (or remove) the step sink" and "A later call replaces the
installed sink, which is never called again."

Bug: the adapter registers the sink as one more engine stat logger (engines keep a list of loggers and call every
one per step); ``None`` clears the list, but a second install without a removal in between leaves the first sink
registered: both get every record.
Trigger: a second report_step_time(sink) on a running host (a job restarted on the same engine, a second
co-serving session) without report_step_time(None) in between.
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
    """step_sinks_accumulate: see the module docstring."""

    def report_step_time(self, sink: StepSink | None) -> None:
        loggers = self.__dict__.setdefault("_stat_loggers", [])  # BUG: installs are appended, never replaced
        if sink is None:
            loggers.clear()
        else:
            loggers.append(sink)
        self._step_sink = (lambda record: [log(record) for log in list(loggers)]) if loggers else None
