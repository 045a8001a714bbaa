"""h15: a profile step's duration_s is seconds: positive and no longer than the wall time of the call."""
import sys
import time
import _common as c
from deltaserve_core.types import ProfileShape


def check(cls):
    h = c.make(cls)
    ic, sink, recs = c.install(h)
    t0 = time.monotonic()
    r = h.run_profile_step(ProfileShape(prefill_lengths=(16,), num_decode=2, decode_context=32, finetune_lengths=(8,)))
    wall = time.monotonic() - t0
    for rec in (r, recs[-1]):
        if not 0 < rec.duration_s <= wall:
            return False, f"duration_s={rec.duration_s:.4f} for a call of {wall:.4f} s"
    return True, f"duration {r.duration_s:.4f} <= {wall:.4f}"


sys.exit(c.verdict(check, "15"))
