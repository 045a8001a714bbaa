"""h11: captures pass through a bfloat16 staging buffer on a float32 engine.

Rule (types.py, HostCapabilities, ``activation_dtype``): "dtype name (...) of captured layer inputs. It must be the
dtype the engine runs in"; (hooks.py, ActivationSink.layer_input): "The input of decoder layer ``layer`` for one
sample".

Bug: the forward-side tap copies each capture into a staging buffer preallocated once with the engine's usual
activation dtype (bfloat16) before handing it to the sink; on an engine that runs float32 (the default
``HostConfig.dtype``) the sink receives rounded bfloat16 tensors while ``activation_dtype`` says ``"float32"``.

Trigger: every captured fine-tuning row on a float32 host (the default).
"""
from __future__ import annotations

import torch

from deltaserve_core.testing.reference_host import ReferenceHost

STAGING_DTYPE = torch.bfloat16


class _StagedTap:
    def __init__(self, inner):
        self.inner = inner
        self.staging = None

    def begin_step(self, step_id, samples):
        self.inner.begin_step(step_id, samples)

    def layer_input(self, step_id, layer, sample_id, hidden):
        n = hidden.shape[0]
        if self.staging is None or self.staging.shape[0] < n or self.staging.shape[1] != hidden.shape[1]:
            self.staging = torch.empty(max(n, 256), hidden.shape[1], dtype=STAGING_DTYPE, device=hidden.device)
        self.staging[:n].copy_(hidden)
        self.inner.layer_input(step_id, layer, sample_id, self.staging[:n])

    def should_abort(self, step_id):
        return self.inner.should_abort(step_id)

    def end_step(self, step_id, completed, aborted):
        self.inner.end_step(step_id, completed, aborted)


class Host(ReferenceHost):
    def capture_activation(self, sink):
        super().capture_activation(None if sink is None else _StagedTap(sink))
