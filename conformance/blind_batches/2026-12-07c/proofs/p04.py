"""p04: decode input token by batch slot. Truth: HF greedy decoding per request."""
from _common import *

A, B = req("a", 12, 41, 10), req("b", 9, 42, 6)
TRUTH = {r.request_id: hf_greedy(r.prompt_ids, r.max_tokens) for r in (A, B)}


def check(cls):
    h = make(cls)
    h.submit(A)
    outs = h.step()  # a's prefill
    h.submit(B)  # b arrives while a decodes
    outs += drain(h)
    got = {o.request_id: list(o.token_ids) for o in outs}
    wrong = [(k, got.get(k), TRUTH[k]) for k in TRUTH if got.get(k) != TRUTH[k]]
    return not wrong, f"a (prompt 12) decoding when b (prompt 9) arrives after step 0; wrong (id, got, truth HF): {wrong}"


run("p04", check, host_module("04").Host)
