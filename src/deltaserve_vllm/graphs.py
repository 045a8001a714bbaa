"""Which steps vLLM replays as a CUDA graph: the prediction behind ``graph_mode`` (imports nothing of vLLM).

The adapter runs CUDA with ``cudagraph_mode=FULL_DECODE_ONLY`` (and eager on CPU). vLLM's V1 model runner then
replays a full graph exactly when the batch is a *uniform decode* (every scheduled request runs one token; no
speculative decoding) and its batch size, padded up to the next ``cudagraph_capture_sizes`` entry, is one of the
uniform-decode graphs its ``CudagraphDispatcher`` captured (sizes up to ``max_num_seqs``; every LoRA-count case is
captured for each size). Anything else -- a prefill, a mixed batch, a batch carrying fine-tuning rows (always
>= 2 tokens), a batch larger than the largest decode graph -- runs eagerly (runtime mode ``NONE``).

The capture facts are read once from the worker's dispatcher after start-up (:class:`GraphSizes`), so the
prediction follows the graphs vLLM actually holds, not a copy of its defaults.

Async scheduling changes none of this: the runner picks the graph from the step's own per-request token counts and
its active LoRAs (vLLM 0.26, ``GPUModelRunner._determine_batch_execution_and_padding``), and under async a request
decoding on an output placeholder is still scheduled one token. (The H200 async run's "misprediction" was steps
that were never offered to the core, so no prediction existed; see the scheduler.) Cascade attention, which would
rule a full graph out, is off by default (``disable_cascade_attn``) and the host does not turn it on.
"""

from __future__ import annotations

import bisect
from collections.abc import Iterable
from dataclasses import dataclass

from deltaserve_core.types import ExecutionMode, ScheduledRequest

__all__ = ["GraphSizes", "predict_mode"]


@dataclass(frozen=True)
class GraphSizes:
    """What vLLM captured: all capture sizes (the padding ladder) and the uniform-decode FULL graph sizes."""

    capture_sizes: tuple[int, ...] = ()
    decode_sizes: frozenset[int] = frozenset()

    @property
    def enabled(self) -> bool:
        return bool(self.decode_sizes)

    def padded(self, num_tokens: int) -> int | None:
        """The capture size a batch of ``num_tokens`` is padded to (smallest capture size >= it), or None."""
        i = bisect.bisect_left(self.capture_sizes, num_tokens)
        return self.capture_sizes[i] if i < len(self.capture_sizes) else None


def predict_mode(scheduled: Iterable[ScheduledRequest], sizes: GraphSizes | None) -> ExecutionMode:
    """GRAPH iff vLLM will replay a full decode graph for a step running exactly ``scheduled``."""
    if sizes is None or not sizes.enabled:
        return ExecutionMode.EAGER
    n = 0
    for r in scheduled:
        if r.prefill_tokens > 1:  # a query longer than one token: not a uniform decode
            return ExecutionMode.EAGER
        n += 1  # a decode, or a prefill of exactly one token (vLLM sees the same 1-token query)
    if n == 0:
        return ExecutionMode.EAGER
    return ExecutionMode.GRAPH if sizes.padded(n) in sizes.decode_sizes else ExecutionMode.EAGER
