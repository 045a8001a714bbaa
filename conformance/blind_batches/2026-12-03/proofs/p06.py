"""p06: calibration steps followed by served steps reach the step sink with unique, increasing step ids."""
from _common import ClientRequest, host_module, install, make, prompt, run
from deltaserve_core.types import ProfileShape


def check(cls):
    h = make(cls)
    ic, sk, rec = install(h)
    h.run_profile_step(ProfileShape(prefill_lengths=(8,)))
    h.run_profile_step(ProfileShape(prefill_lengths=(4, 4), num_decode=2, decode_context=8))
    h.generate([ClientRequest("r", prompt(5, 1), 3)])
    ids = [r.step_id for r in rec.records]
    ok = len(ids) == 5 and all(b > a for a, b in zip(ids, ids[1:]))
    return ok, f"record step ids {ids} (2 calibration steps, then 3 served)"


run("p06", check, host_module("06").Host)
