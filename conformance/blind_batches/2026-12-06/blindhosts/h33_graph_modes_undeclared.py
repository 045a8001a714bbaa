"""Broken host (CUDA-graph model): capabilities declare EAGER only while decode steps replay graphs.

Rule (types.py, HostCapabilities): "``graph_modes``: execution modes the host can run steps in. ``{EAGER}`` for hosts
without CUDA graphs." (types.py, ProfileShape: "The record's ``mode`` is the mode the step ran in (one of
``graph_modes``)".)

Bug: the adapter's capabilities were copied from the reference host's template (``graph_modes={EAGER}``) and never
updated when CUDA graphs were enabled (the engine default); decode-only steps run and are recorded GRAPH, a mode the
core was told does not exist (it keeps no GRAPH coefficients and never calibrates them).

Trigger: any decode-only step of at most 8 requests. Base: ``_graphs.GraphHost`` (correct).
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
from blindhosts._graphs import EAGER, GraphHost



class Host(GraphHost):
    def __init__(self, config) -> None:
        super().__init__(config)
        # BUG: capabilities from the eager template: GRAPH is never declared
        self._capabilities = replace(self._capabilities, graph_modes=frozenset({EAGER}))
