"""h15: graph_mode depends on which batch sizes have been captured so far (lazy CUDA-graph capture).

Rule (hooks.py, HostHooks.graph_mode): "Must be a pure function of the batch's shape and the host's configuration,
and agree with the ``mode`` of the step's :class:`StepRecord` whenever no fine-tuning rows were added."

Bug: the engine captures CUDA graphs lazily: the first decode step of a given padded batch size runs eagerly and
captures, later ones replay. The adapter's ``graph_mode`` mirrors the runner faithfully, so it agrees with each
record, but its answer for the same batch shape changes over the host's lifetime (EAGER the first time, GRAPH
after). Graph handling otherwise as in ``_graphs.GraphHost``.

Trigger: two decode-only steps of the same padded size (any request generating three or more tokens).
"""
from __future__ import annotations

import bisect

from blindhosts._graphs import CAPTURE_SIZES, EAGER, GRAPH, GraphHost


def _padded(n):
    i = bisect.bisect_left(CAPTURE_SIZES, n)
    return CAPTURE_SIZES[i] if i < len(CAPTURE_SIZES) else None


class Host(GraphHost):
    def __init__(self, config) -> None:
        super().__init__(config)
        self._captured: set[int] = set()

    def graph_mode(self, batch):
        mode = super().graph_mode(batch)
        if mode is GRAPH and _padded(batch.num_decode) not in self._captured:
            return EAGER  # not captured yet: this step runs eagerly and captures
        return mode

    def _run_mode(self, rows, synthetic):
        mode = super()._run_mode(rows, synthetic)
        if mode is GRAPH:
            size = _padded(len(rows))
            if size not in self._captured:
                self._captured.add(size)
                return EAGER
        return mode
