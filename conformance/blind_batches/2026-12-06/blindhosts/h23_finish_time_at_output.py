"""Broken host: ``ClientOutput.finish_time`` is when the output was built, not the last token's time.

Rule (driver.py, ClientOutput): "``token_times``, when given, holds exactly one time per token of ``token_ids``, in
order and non-decreasing, the first equal to ``first_token_time`` and the last to ``finish_time``."

Bug: the driver takes ``finish_time`` from the engine's request stats (``finished_time``, stamped when the output
processor frees the request after the step's outputs were processed), while ``token_times`` are the sampling
times: the last token time and ``finish_time`` differ by the output processing of the step.

Trigger: every finished request.
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
    def step(self):
        outputs = super().step()
        now = time.monotonic()  # the output processor frees the requests
        return [replace(o, finish_time=now) for o in outputs]  # BUG: finished_time, not the last token's time
