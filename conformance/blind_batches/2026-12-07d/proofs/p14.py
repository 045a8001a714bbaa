"""p14: run_profile_step(shape with repeats=3): every forward the host runs has its StepRecord (forwards counted by a
hook on the embedding)."""
from _common import *
from deltaserve_core.types import ProfileShape


def check(cls):
    h = make(cls)
    rec = Records()
    h.report_step_time(rec)
    n = [0]
    h.model.model.embed_tokens.register_forward_pre_hook(lambda m, a: n.__setitem__(0, n[0] + 1))
    r = h.run_profile_step(ProfileShape(prefill_lengths=(8,), num_decode=2, decode_context=16, repeats=3))
    return n[0] == len(rec.records) and r.synthetic, (f"repeats=3: forwards {n[0]}, records delivered "
                                                     f"{len(rec.records)}")


run("p14", check, host_module("14").Host)
