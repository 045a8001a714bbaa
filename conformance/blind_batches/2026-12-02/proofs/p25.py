from common import *
from deltaserve_core.types import ProfileShape
RULE = 'HostHooks.run_profile_step: "The record is also delivered to the step sink with synthetic=True" (a decode shape)'
def check(cls):
    h = make(cls); icp, sink, steps = install(h)
    probs = []
    for shape in (ProfileShape(prefill_lengths=(32,)), ProfileShape(num_decode=4, decode_context=32)):
        n = len(steps.records)
        rec = h.run_profile_step(shape)
        got = steps.records[n:]
        if not rec.synthetic or len(got) != 1 or not got[0].synthetic:
            probs.append(f"{shape}: returned synthetic={rec.synthetic}, sink got {[r.synthetic for r in got]}")
    return not probs, "; ".join(probs) or "synthetic records"
run_proof("h25_profile_decode_not_synthetic", RULE, check, "blindhosts.h25_profile_decode_not_synthetic:Host")
