"""Which steps vLLM replays as a CUDA graph: the prediction behind ``graph_mode`` (imports nothing of vLLM).

vLLM's V1 model runner asks its ``CudagraphDispatcher`` per step; the V2 runner asks its ``CudaGraphManager``, with
the same padding ladder and the same two kinds of graph (the worker reads either through its runner view,
:mod:`.runner_view`). With torch.compile (the adapter's CUDA default, vLLM's ``FULL_AND_PIECEWISE``) a *uniform
decode* (every scheduled request runs one token; no speculative decoding) whose batch size, padded up to the next
``cudagraph_capture_sizes`` entry, is a captured full graph replays that graph; any other batch whose token count
pads to a captured piecewise size replays the piecewise graphs; the rest runs without graphs (runtime mode
``NONE``). Without compilation (``FULL_DECODE_ONLY``) only the first case exists.
A batch carrying fine-tuning rows never replays a graph: the worker makes the runner's graph decision choose none
(:mod:`.layer_tap` says why), so the prediction is about the inference batch the host proposes.

The capture facts are read once from the worker's dispatcher (V2: graph manager) after start-up
(:class:`GraphSizes`), so the prediction follows the graphs vLLM actually holds, not a copy of its defaults. A size
counts only if it was captured for every LoRA case vLLM keys graphs by (with and without active LoRAs, each
active-LoRA count): the prediction cannot see which adapters a batch uses.

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
    piecewise_sizes: frozenset[int] = frozenset()

    @classmethod
    def from_worker(cls, sizes: dict[str, list[int]]) -> GraphSizes:
        """From the worker's ``deltaserve_graph_sizes`` answer."""
        return cls(tuple(sizes["capture_sizes"]), frozenset(sizes["decode_sizes"]),
                   frozenset(sizes.get("piecewise_sizes", ())))

    @property
    def enabled(self) -> bool:
        return bool(self.decode_sizes or self.piecewise_sizes)

    def padded(self, num_tokens: int) -> int | None:
        """The capture size a batch of ``num_tokens`` is padded to (smallest capture size >= it), or None."""
        i = bisect.bisect_left(self.capture_sizes, num_tokens)
        return self.capture_sizes[i] if i < len(self.capture_sizes) else None


def predict_mode(scheduled: Iterable[ScheduledRequest], sizes: GraphSizes | None) -> ExecutionMode:
    """GRAPH iff vLLM will replay a CUDA graph (full or piecewise) for a step running exactly ``scheduled``."""
    if sizes is None or not sizes.enabled:
        return ExecutionMode.EAGER
    n = tokens = 0
    uniform = True
    for r in scheduled:
        n += 1
        if r.prefill_tokens > 1:  # a query longer than one token: not a uniform decode
            uniform = False
        tokens += max(r.prefill_tokens, 1)  # a decode, or a one-token prefill, is one token
    if n == 0:
        return ExecutionMode.EAGER
    if uniform and sizes.padded(n) in sizes.decode_sizes:
        return ExecutionMode.GRAPH
    return ExecutionMode.GRAPH if sizes.padded(tokens) in sizes.piecewise_sizes else ExecutionMode.EAGER
