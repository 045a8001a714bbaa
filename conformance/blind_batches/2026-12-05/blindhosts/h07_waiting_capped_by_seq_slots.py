"""h07: ProposedBatch.waiting lists only the queued requests that could still get a sequence slot.

Rule (types.py, ProposedBatch): "Every request that arrived and has not finished must be in ``scheduled`` or
``waiting`` (the core prices admission against all of them)."

Bug: the adapter builds ``waiting`` from the requests the engine's scheduler still considers admissible this step:
at most ``max_running_requests - running`` of the queue head (vLLM parks the rest while ``max_num_seqs`` is
reached). Once every sequence slot is taken, the queued requests disappear from the batch although their TTFT
clocks run.

Trigger: more requests in the host than ``max_running_requests`` (32 by default), e.g. 40 requests submitted at
once.
"""
from __future__ import annotations

from deltaserve_core.testing.reference_host import ReferenceHost


class Host(ReferenceHost):
    def _schedule(self):
        prefills, decodes, left = super()._schedule()
        slots = max(0, self.config.max_running_requests - len(self._running) - len(prefills))
        return prefills, decodes, left[:slots]
