"""p23: the step prefilling a one-token prompt reports it as a prefill of length 1, no decode."""
from _common import *  # noqa: F401,F403
from _common import CACHE  # noqa: F401

H = host_module("23").Host


def check(cls):
    h = make(cls)
    ic, sk, rec = install(h)
    h.generate([ClientRequest("a", prompt(1, 151), 3)])
    r = rec.records[0]
    got = (r.prefill_lengths, r.num_decode, r.kv_tokens)
    # step 0 runs only a's prompt (1 token, no KV); steps 1, 2 decode it
    later = [(x.prefill_lengths, x.num_decode, x.kv_tokens) for x in rec.records[1:]]
    return got == ((1,), 0, 0), f"prompt of 1 token, 3 tokens; record of its prefill step (prefill_lengths, num_decode, " \
                                f"kv_tokens) {got}; later {later}"


run("p23", check, H)
