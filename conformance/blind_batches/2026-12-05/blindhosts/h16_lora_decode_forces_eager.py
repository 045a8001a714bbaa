"""h16: decode steps with a client LoRA row run eagerly while graph_mode still says GRAPH.

Rule (hooks.py, HostHooks.graph_mode): "The execution mode the host would use for ``batch`` without fine-tuning
rows. ... Must ... agree with the ``mode`` of the step's :class:`StepRecord` whenever no fine-tuning rows were
added."

Bug: the engine's captured graphs were recorded without LoRA slots, so its model runner falls back to eager for any
decode step that has a row on a LoRA adapter; the adapter's ``graph_mode`` looks only at the decode count (the batch
size padding rule) and answers GRAPH. The record says EAGER. Graph handling otherwise as in ``_graphs.GraphHost``.

Trigger: a decode-only step of <= 8 rows with at least one request on a client adapter.
"""
from __future__ import annotations

from blindhosts._graphs import EAGER, GraphHost


class Host(GraphHost):
    def _run_mode(self, rows, synthetic):
        if any(r.adapter is not None for r in rows):
            return EAGER  # graphs were captured without LoRA: LoRA decode runs eagerly
        return super()._run_mode(rows, synthetic)
