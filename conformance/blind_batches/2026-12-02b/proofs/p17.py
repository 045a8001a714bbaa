"""h17: a profile step runs the shape it was given: 3 decodes at context 40 -> kv_tokens 120."""
import sys
import _common as c
from deltaserve_core.types import ProfileShape


def check(cls):
    h = c.make(cls)
    ic, sink, recs = c.install(h)
    r = h.run_profile_step(ProfileShape(prefill_lengths=(8,), num_decode=3, decode_context=40))
    if (r.num_decode, r.kv_tokens, r.prefill_lengths) != (3, 120, (8,)):
        return False, f"ran decode={r.num_decode} kv={r.kv_tokens} prefill={r.prefill_lengths}"
    return True, "shape ran"


sys.exit(c.verdict(check, "17"))
