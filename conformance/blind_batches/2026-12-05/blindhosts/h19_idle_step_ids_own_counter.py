"""h19: fine-tuning-only steps are numbered by the idle loop's own counter, reusing served step ids.

Rule (types.py, StepRecord): "A ``step_id`` is never reused: calibration and served steps draw from one increasing
sequence for the host's lifetime."

Bug: the adapter runs fine-tuning-only steps from a separate idle loop (the engine's main loop only steps when it
has client work) that keeps its own step counter starting at 0: its ProposedBatch, captures and records reuse ids
that served steps already had, and ids no longer increase.

Trigger: ``run_idle_step()`` after any served step (or a second time after calibration).
"""
from __future__ import annotations

import itertools

from deltaserve_core.testing.reference_host import ReferenceHost


class Host(ReferenceHost):
    def __init__(self, config) -> None:
        super().__init__(config)
        self._idle_ids = itertools.count()

    def run_idle_step(self):
        served_ids, self._step_ids = self._step_ids, self._idle_ids
        try:
            return super().run_idle_step()
        finally:
            self._step_ids = served_ids
