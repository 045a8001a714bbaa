"""h03: fine-tuning rows, injected as prompt-only engine requests, come out of step() as finished outputs.

Rule (hooks.py, HostHooks.intercept_schedule): the host "adds the returned samples to that same step as
prefill-only rows on the reserved adapter (no prefix-cache reads, no sampling output), retires them after that one
forward, and never lets them reach a client."

Bug: the adapter injects each sample the way vLLM adds a prompt-only request (``ft-<sample_id>``, max_tokens=0);
when the row is retired the engine's output processor emits a finished output for it like for any request, and
the driver's ``step()`` returns it with the client outputs.

Trigger: any step that carries fine-tuning rows and is run by ``step()`` (fine-tuning rows beside client rows).
"""
from __future__ import annotations

import time

from deltaserve_core.driver import ClientOutput
from deltaserve_core.testing.reference_host import ReferenceHost


class Host(ReferenceHost):
    _retired: list = []

    def _execute(self, step_id, rows, tokens, synthetic=False):
        record = super()._execute(step_id, rows, tokens, synthetic)
        if not synthetic:
            self._retired = list(self._retired) + list(record.finetune_sample_ids)
        return record

    def step(self):
        outputs = super().step()
        now = time.monotonic()
        for sid in self._retired:  # the engine's finished prompt-only requests
            outputs.append(ClientOutput(f"ft-{sid}", (), now, now, now, ()))
        self._retired = []
        return outputs
