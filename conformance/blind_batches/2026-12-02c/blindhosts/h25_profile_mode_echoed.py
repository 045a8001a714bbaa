"""
h25 - run_profile_step reports the mode the shape asked for, not the mode the step ran in.

Rule (types.py, ProfileShape): the host runs the synthetic step "in ``mode`` when it can (falling back to the mode
it would naturally choose), and reports the resulting :class:`StepRecord`"; hooks.py run_profile_step: "Execute
one synthetic step of ``shape`` through the host's normal path and return its record"; report_step_time: "with the
composition that actually ran".

Bug: the adapter's profile path copies ``shape.mode`` into the record (it was written for an engine with CUDA
graphs, where the requested mode is honoured). On an eager-only host, calibration asking for GRAPH gets records
labelled GRAPH for eager steps, and the latency model fits its GRAPH coefficients from eager timings.

Trigger: calibration asking for ``ExecutionMode.GRAPH`` on a host whose ``graph_modes`` is ``{EAGER}``.
"""
from __future__ import annotations

import dataclasses

from deltaserve_core.testing.reference_host import ReferenceHost


class Host(ReferenceHost):
    def run_profile_step(self, shape):
        sink, self._step_sink = self._step_sink, None
        try:
            record = super().run_profile_step(shape)
        finally:
            self._step_sink = sink
        record = dataclasses.replace(record, mode=shape.mode)  # the requested mode, as on the CUDA engine
        if sink is not None:
            sink(record)
        return record
