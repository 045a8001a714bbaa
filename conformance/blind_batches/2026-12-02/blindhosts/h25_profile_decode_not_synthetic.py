"""Profile shapes with decode rows go through the host's regular decode path, which stamps synthetic=False."""
import dataclasses

from ._base import Patchable


class Host(Patchable):
    name = "blind-h25"

    def run_profile_step(self, shape):
        self._profile_decode = shape.num_decode > 0
        try:
            return super().run_profile_step(shape)
        finally:
            self._profile_decode = False

    def _make_record(self, *a, **k):
        rec = super()._make_record(*a, **k)
        if rec.synthetic and getattr(self, "_profile_decode", False):
            rec = dataclasses.replace(rec, synthetic=False)  # BUG
        return rec
