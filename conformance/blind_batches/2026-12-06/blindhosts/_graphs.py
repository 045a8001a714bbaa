"""A correct CUDA-graph model for the reference engine, shared by the graph hosts of this batch (h06, h14, h33, h34).

Decode-only steps of at most ``max(CAPTURE_SIZES)`` rows "replay a graph" (no module hooks fire, so the activation
sink is not called) and are recorded ``GRAPH``; every other step, and every step that carries fine-tuning rows,
runs eagerly. ``graph_mode`` is the pure function of the proposed batch's shape that predicts this. Each graph host
changes exactly one of these pieces. Calibration steps run in the shape's mode when it can (decode-only), else
eagerly.
"""
from __future__ import annotations

from dataclasses import replace

from deltaserve_core.testing.reference_host import ReferenceHost
from deltaserve_core.types import ExecutionMode

CAPTURE_SIZES = (1, 2, 4, 8)
GRAPH, EAGER = ExecutionMode.GRAPH, ExecutionMode.EAGER


class GraphHost(ReferenceHost):
    def __init__(self, config) -> None:
        super().__init__(config)
        self._capabilities = replace(self._capabilities, graph_modes=frozenset({EAGER, GRAPH}))
        self._profile_mode = None

    def graph_mode(self, batch):
        if batch.scheduled and not batch.has_prefill and batch.num_decode <= max(CAPTURE_SIZES):
            return GRAPH
        return EAGER

    def _run_mode(self, rows, synthetic):
        """What the model runner does with these rows."""
        if any(r.sample is not None for r in rows):
            return EAGER
        decode_only = bool(rows) and all(r.past > 0 or r.fake_kv is not None for r in rows)
        if not decode_only or len(rows) > max(CAPTURE_SIZES):
            return EAGER
        if synthetic and self._profile_mode is not GRAPH:
            return EAGER
        return GRAPH

    def run_profile_step(self, shape):
        self._profile_mode = shape.mode
        try:
            return super().run_profile_step(shape)
        finally:
            self._profile_mode = None

    def _execute(self, step_id, rows, tokens, synthetic=False):
        mode = self._run_mode(rows, synthetic)
        if mode is EAGER:
            return super()._execute(step_id, rows, tokens, synthetic)
        sink, step_sink = self._activation_sink, self._step_sink
        self._activation_sink, self._step_sink = None, None  # graph replay: no Python hooks fire
        try:
            record = super()._execute(step_id, rows, tokens, synthetic)
        finally:
            self._activation_sink, self._step_sink = sink, step_sink
        record = replace(record, mode=GRAPH)
        if step_sink is not None:
            step_sink(record)
        return record
