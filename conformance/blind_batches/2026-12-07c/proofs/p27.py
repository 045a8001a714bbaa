"""p27: context_tokens = seq_len - 1. Truth: arithmetic (KV before a prompt's first step is 0; prompt + j after)."""
from _common import *


def check(cls):
    h = make(cls)
    ic, sk, rec = install(h)
    h.generate([req("a", 10, 271, 4)])
    got = [(v.prefill_tokens, v.context_tokens) for b in ic.batches for v in b.scheduled if v.request_id == "a"]
    want = [(10, 0), (0, 10), (0, 11), (0, 12)]
    return got == want, f"prompt 10, 4 tokens; (prefill_tokens, context_tokens) offered {got}; truth {want}"


run("p27", check, host_module("27").Host)
