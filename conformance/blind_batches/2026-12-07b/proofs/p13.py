"""p13: a decoding request's context_tokens is prompt + tokens generated before the step."""
from _common import *  # noqa: F401,F403
from _common import CACHE  # noqa: F401

H = host_module("13").Host


def check(cls):
    h = make(cls)
    ic, sk, rec = install(h)
    h.generate([req("a", 10, 81, 6)])
    got, want = [], []
    for b in ic.batches:
        for r in b.scheduled:
            if r.request_id == "a" and r.prefill_tokens == 0:
                got.append(r.context_tokens)
                want.append(10 + len(want))  # the j-th decode attends over the prompt and j earlier outputs
    return got == want, f"prompt 10, 6 tokens; decode context_tokens offered {got}, KV length {want}"


run("p13", check, H)
