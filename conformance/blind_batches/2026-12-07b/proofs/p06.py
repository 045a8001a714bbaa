"""p06: a decodes while b is prefilled in the same step; both match HF greedy."""
from _common import *  # noqa: F401,F403
from _common import CACHE  # noqa: F401

H = host_module("06").Host


def check(cls):
    h = make(cls)
    a, b = req("a", 12, 41, 8), req("b", 9, 42, 8)
    h.submit(a)
    outs = h.step()
    h.submit(b)
    outs += drain(h)
    got = {o.request_id: list(o.token_ids) for o in outs}
    truth = {r.request_id: hf_greedy(r.prompt_ids, 8) for r in (a, b)}
    wrong = [(k, got.get(k), truth[k]) for k in truth if got.get(k) != truth[k]]
    return not wrong, f"a (prompt 12) decoding when b (prompt 9) arrives at step 1; wrong (id, got, truth HF): {wrong}"


run("p06", check, H)
