"""Broken host: graph_mode() answers from the CUDA-graph capture sizes without looking at enforce_eager.

Rule (src/deltaserve_core/hooks.py, HostHooks.graph_mode): "The execution mode the host would use for ``batch``
without fine-tuning rows. ... Must be a pure function of the batch's shape and the host's configuration, and agree
with the ``mode`` of the step's StepRecord whenever no fine-tuning rows were added."

Bug: the adapter mirrors vLLM's rule "decode-only batches up to the largest capture size replay a CUDA graph" and
returns GRAPH for them, but this engine runs with enforce_eager (the only way it runs: capabilities declare EAGER
only) and every step actually runs, and is recorded, EAGER.
Trigger: any decode-only step of at most 8 requests (every request's second token onwards).
"""
from deltaserve_core.testing.reference_host import ReferenceHost
from deltaserve_core.types import ExecutionMode, ProposedBatch

_CAPTURE_SIZES = (1, 2, 4, 8)


class Host(ReferenceHost):
    name = "blind-h06"

    def graph_mode(self, batch: ProposedBatch) -> ExecutionMode:
        # BUG: enforce_eager is not consulted
        if batch.scheduled and not batch.has_prefill and batch.num_decode <= max(_CAPTURE_SIZES):
            return ExecutionMode.GRAPH
        return ExecutionMode.EAGER
