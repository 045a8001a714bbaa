"""
h26 - calibration steps drop their fine-tuning rows while no fine-tuning adapter is loaded.

Rule (hooks.py, HostHooks.run_profile_step): "Execute one synthetic step of ``shape`` through the host's normal
path and return its record. Called by calibration before the host accepts client requests." (types.py
ProfileShape: "A synthetic step for calibration: prefill lengths, a decode batch with its KV length, FT tokens.")

Bug: calibration runs before the job installs the reserved adapter; the adapter's profile path has no LoRA to run
the synthetic fine-tuning rows on and leaves them out (``if RESERVED not loaded: finetune_lengths = ()``). The
record honestly shows no fine-tuning rows, so every profiled fine-tuning token costs nothing and the latency model
learns that fine-tuning is free.

Trigger: calibration (``deltaserve calibrate`` or the first start of a job) on a host where set_finetune_adapter
has not been called yet: the normal order.
"""
from __future__ import annotations

import dataclasses

from deltaserve_core.hooks import RESERVED_ADAPTER_NAME
from deltaserve_core.testing.reference_host import ReferenceHost


class Host(ReferenceHost):
    def run_profile_step(self, shape):
        if RESERVED_ADAPTER_NAME not in self._adapters and shape.finetune_lengths:
            shape = dataclasses.replace(shape, finetune_lengths=())  # no LoRA to run them on yet
        return super().run_profile_step(shape)
