"""p27: one profile step delivers exactly one record (synthetic=True) to the step sink."""
from _common import *  # noqa: F403
from deltaserve_core.types import ProfileShape


def check(cls):
    h = make(cls)
    ic, sk, rec = install(h)
    h.run_profile_step(ProfileShape(prefill_lengths=(8,), num_decode=2, decode_context=16))
    got = [(r.step_id, r.synthetic) for r in rec.records]
    return len(got) == 1 and got[0][1], f"records delivered {got}"


run("p27", check, host_module("27").Host)
