"""p23: run_profile_step delivers its record to the step sink with synthetic=True, exactly once
(hooks.py, run_profile_step)."""
import _common as c
from deltaserve_core.types import ProfileShape


def check(cls):
    h = c.make(cls)
    rec = c.Records()
    h.report_step_time(rec)
    got = h.run_profile_step(ProfileShape(prefill_lengths=(8,), num_decode=2, decode_context=16,
                                          finetune_lengths=(6,)))
    flags = [r.synthetic for r in rec.records]
    ok = got.synthetic and flags == [True] and rec.records[0].step_id == got.step_id
    return ok, f"returned synthetic={got.synthetic}; sink got {len(flags)} record(s) with synthetic={flags}"


c.run("p23", check, c.host_module("23").Host)
