"""
h02 - the fine-tuning rows of one step reach attention as one packed sequence.

Rule (hooks.py, ActivationSink.layer_input): "The input of decoder layer ``layer`` for one sample: shape
``[num_tokens, hidden_size]``." -- each sample's own forward; and HostHooks.intercept_schedule: the host "adds the
returned samples to that same step as prefill-only rows", one row per sample.

Bug: to spend one request slot (and one LoRA-index entry) on the whole injected group, the adapter gives the
attention metadata a single sequence for all fine-tuning rows of the step (one ``seq_len`` entry / one
``cu_seqlens`` span). Positions are still per sample, but from layer 0's attention on, every later sample attends
causally to the samples before it.

Trigger: a step that carries two or more fine-tuning samples (the core packs several short samples per step).
The first sample of the step is exact; the others are not from layer 1 on.
"""
from __future__ import annotations

from deltaserve_core.testing.reference_host import ReferenceHost, _Row


class Host(ReferenceHost):
    def _layer(self, li, layer, hidden, rows, cos, sin, index):
        packed: list[_Row] = []
        for r in rows:
            if r.sample is not None and packed and packed[-1].sample is not None \
                    and packed[-1].start + packed[-1].length == r.start:
                last = packed[-1]  # one attention span for the injected group
                packed[-1] = _Row(last.start, last.length + r.length, last.adapter, sample=last.sample)
            else:
                packed.append(r)
        return super()._layer(li, layer, hidden, packed, cos, sin, index)
