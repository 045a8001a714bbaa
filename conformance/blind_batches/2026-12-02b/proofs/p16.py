"""h16: the step sink receives the profile step's record with synthetic=True."""
import sys
import _common as c
from deltaserve_core.types import ProfileShape


def check(cls):
    h = c.make(cls)
    ic, sink, recs = c.install(h)
    r = h.run_profile_step(ProfileShape(prefill_lengths=(8,), num_decode=1, decode_context=8))
    if len(recs) != 1 or not recs[0].synthetic or not r.synthetic:
        return False, f"returned synthetic={r.synthetic}, sink got {[x.synthetic for x in recs]}"
    return True, "synthetic both"


sys.exit(c.verdict(check, "16"))
