"""StepRecord composition derived from a per-step 'is_prefill' flag: a mixed step (prefill + decode rows) is
reported as a pure prefill step (num_decode=0, kv_tokens=0)."""
import dataclasses

from ._base import Patchable


class Host(Patchable):
    name = "blind-h06"

    def _make_record(self, *a, **k):
        rec = super()._make_record(*a, **k)
        if rec.prefill_lengths:
            rec = dataclasses.replace(rec, num_decode=0, kv_tokens=0)  # BUG
        return rec
