"""p19: a calibration step's record reports the KV its decode rows attended over."""
from _common import *  # noqa: F401,F403

from deltaserve_core.types import ProfileShape

H = host_module("19").Host
SHAPE = ProfileShape(prefill_lengths=(16,), num_decode=4, decode_context=64)


def check(cls):
    h = make(cls)
    rec = Records()
    h.report_step_time(rec)
    r = h.run_profile_step(SHAPE)
    truth = SHAPE.num_decode * SHAPE.decode_context
    sunk = [x.kv_tokens for x in rec.records]
    ok = r.num_decode == 4 and r.kv_tokens == truth and sunk == [truth]
    return ok, f"shape 4 decodes x 64 context (+ prefill 16): returned kv_tokens {r.kv_tokens}, sink {sunk}, truth {truth}"


run("p19", check, H)
