"""h18: StepRecord.num_decode counts every running request, also the decodes a prefill step deferred.

Rule (hooks.py, HostHooks.report_step_time): "exactly one StepRecord per executed step ... with the composition
that actually ran"; types.py, HostCapabilities.mixed_batches: "S-LoRA never mixes them" (a prefill step of such a
host runs no decode).

Bug: on a host without mixed batches the adapter fills ``num_decode``/``kv_tokens`` from the engine's running
batch (``len(running_batch)``, S-LoRA style) instead of from the rows the step ran: a prefill step that deferred
the running decodes reports them as decoded.
Trigger: mixed_batches=False and a request arriving while others decode.
"""
import dataclasses

from deltaserve_core.testing.reference_host import ReferenceHost


class Host(ReferenceHost):
    def _execute(self, step_id, rows, tokens, synthetic=False):
        running = [s for s in self._running if s.output]  # requests already decoding (new prefills have no output)
        kv = sum(s.context for s in running)
        sink, self._step_sink = self._step_sink, None
        try:
            record = super()._execute(step_id, rows, tokens, synthetic)
        finally:
            self._step_sink = sink
        if not synthetic:
            record = dataclasses.replace(record, num_decode=len(running), kv_tokens=kv)
        if sink is not None:
            sink(record)
        return record
