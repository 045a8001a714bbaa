"""Broken host (CUDA-graph model): ``graph_mode`` predicts GRAPH only for exactly captured batch sizes.

Rule (hooks.py, HostHooks.graph_mode): "Must be a pure function of the batch's shape and the host's configuration,
and agree with the ``mode`` of the step's :class:`StepRecord` whenever no fine-tuning rows were added."

Bug: the model runner pads a decode batch up to the next captured size (1, 2, 4, 8) and replays that graph, but
``graph_mode`` tests ``num_decode in capture_sizes``: decode batches of 3, 5, 6 or 7 are predicted EAGER and run (and
are recorded) GRAPH.

Trigger: a decode-only step of 3, 5, 6 or 7 requests. Base: ``_graphs.GraphHost`` (correct).
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
from blindhosts._graphs import CAPTURE_SIZES, EAGER, GRAPH, GraphHost



class Host(GraphHost):
    def graph_mode(self, batch):
        if batch.scheduled and not batch.has_prefill and batch.num_decode in CAPTURE_SIZES:  # BUG: no padding
            return GRAPH
        return EAGER
