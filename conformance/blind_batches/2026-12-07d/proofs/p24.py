"""p24: a calibration step with 64 decode rows of 4096 context: its StepRecord.start_time is at the forward (within
20 ms before the embedding runs), not at the start of the call (where the dummy KV is built)."""
from _common import *
from deltaserve_core.types import ProfileShape


def check(cls):
    h = make(cls)
    rec = Records()
    h.report_step_time(rec)
    t = []
    h.model.model.embed_tokens.register_forward_pre_hook(lambda m, a: t.append(time.monotonic()))
    t0 = time.monotonic()
    r = h.run_profile_step(ProfileShape(prefill_lengths=(8,), num_decode=64, decode_context=4096))
    t1 = time.monotonic()
    gap = t[0] - r.start_time
    return gap < 0.02, (f"call {t1 - t0:.3f} s; start_time {r.start_time - t0:.3f} s after call entry, "
                        f"{gap:.3f} s before the forward; duration_s {r.duration_s:.3f}")


run("p24", check, host_module("24").Host)
