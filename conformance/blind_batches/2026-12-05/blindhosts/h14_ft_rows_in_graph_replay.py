"""h14: fine-tuning rows injected into a graph-eligible decode step run inside the graph replay.

Rule (hooks.py, HostHooks.capture_activation): "Steps that carry fine-tuning rows must run eagerly so that capture
hooks fire."

Bug: the model runner decides graph or eager from the batch as the scheduler proposed it (the decode count), before
the interceptor's rows were added: a decode-only step of <= 8 rows that received fine-tuning rows still replays the
captured graph (padded to the capture size), so the capture hooks never fire; the record says GRAPH and lists the
samples as completed. Graph handling otherwise as in ``_graphs.GraphHost`` (decode-only steps of <= 8 rows replay).

Trigger: fine-tuning rows admitted into a decode-only step of at most 8 client decodes (the default graph
settings; the core admits into decode steps on mixed-batch hosts).
"""
from __future__ import annotations

from blindhosts._graphs import CAPTURE_SIZES, EAGER, GRAPH, GraphHost


class Host(GraphHost):
    def _run_mode(self, rows, synthetic):
        client = [r for r in rows if r.sample is None]  # the proposed batch; injected rows not looked at
        decode_only = bool(client) and all(r.past > 0 or r.fake_kv is not None for r in client)
        if not decode_only or len(client) > max(CAPTURE_SIZES):
            return EAGER
        if synthetic and self._profile_mode is not GRAPH:
            return EAGER
        return GRAPH
