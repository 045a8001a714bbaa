"""h03: all decode rows of a step run with the LoRA adapter of the first decode row.

Rule (driver.py, ClientRequest / HostConfig.client_adapters; HostDriver.generate): each request is served with the
adapter it names (``adapter``; ``None`` = the base model) and its greedy output is that model's.

Bug: the adapter's decode path uses a single-adapter LoRA kernel per decode batch (as an S-LoRA/punica port
without the multi-LoRA BGMV index would): the adapter of the first decode row is applied to every decode row of
the step. Prefill rows keep their own adapter.
Trigger: two concurrent requests on different adapters (or one on an adapter, one on the base) decoding together.
"""
import dataclasses

from deltaserve_core.testing.reference_host import ReferenceHost


class Host(ReferenceHost):
    def _execute(self, step_id, rows, tokens, synthetic=False):
        decodes = [r for r in rows if r.seq is not None and r.past > 0]
        if decodes:
            adapter = decodes[0].adapter
            rows = [dataclasses.replace(r, adapter=adapter) if (r.seq is not None and r.past > 0) else r
                    for r in rows]
        return super()._execute(step_id, rows, tokens, synthetic)
