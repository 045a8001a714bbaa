"""Broken host: ``has_unfinished()`` counts fine-tuning rows the engine has not freed yet.

Rule (driver.py, HostDriver.has_unfinished): "Whether any submitted client request has not finished. Fine-tuning and
calibration rows never count: it is False once every client request has been returned, whatever ran since."

Bug: fine-tuning rows are engine requests; like vLLM's scheduler, the engine frees requests that finished in a step
at the top of the *next* ``schedule()``. ``has_unfinished`` asks the engine (``scheduler.has_unfinished_requests()``)
and so stays True after any step that carried fine-tuning rows until the next step runs. (The idle loop's own guard
in ``run_idle_step`` counts client requests only, so fine-tuning-only steps keep running.)

Trigger: ``has_unfinished()`` after ``run_idle_step()`` ran a fine-tuning-only step, or after any step with
fine-tuning rows in which the last client request finished.
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
    def __init__(self, config) -> None:
        super().__init__(config)
        self._ft_unfreed: list[int] = []  # fine-tuning engine requests retired by their forward, freed next schedule()

    def _schedule(self):
        self._ft_unfreed.clear()  # finished requests are freed at the top of the next schedule()
        return super()._schedule()

    def _execute(self, step_id, rows, tokens, synthetic=False):
        record = super()._execute(step_id, rows, tokens, synthetic)
        if not synthetic:
            self._ft_unfreed.extend(r.sample.sample_id for r in rows if r.sample is not None)
        return record

    def has_unfinished(self) -> bool:
        return bool(self._waiting or self._running or self._ft_unfreed)  # BUG: engine requests, FT rows included

    def run_idle_step(self) -> bool:
        if self._waiting or self._running:  # the idle loop's guard: client requests only
            return False
        return bool(self._step(allow_idle=True, report_executed=True))
