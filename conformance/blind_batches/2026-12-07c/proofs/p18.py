"""p18: calibration kv_tokens = max, not sum. Truth: arithmetic (num_decode * decode_context)."""
from _common import *
from deltaserve_core.types import ProfileShape

SHAPE = ProfileShape(prefill_lengths=(8,), num_decode=4, decode_context=32)


def check(cls):
    h = make(cls)
    ic, sk, rec = install(h)
    r = h.run_profile_step(SHAPE)
    got = (r.num_decode, r.kv_tokens, [(d.num_decode, d.kv_tokens) for d in rec.records])
    return r.kv_tokens == 4 * 32 and all(d.kv_tokens == 128 for d in rec.records), (
        f"shape num_decode 4, decode_context 32 (truth kv_tokens 128); (num_decode, kv_tokens) returned and delivered: {got}")


run("p18", check, host_module("18").Host)
