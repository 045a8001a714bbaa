"""p01: two requests decoding in one step with different contexts must each get HF's greedy tokens."""
from _common import *  # noqa: F403

Host = host_module("01").Host
REQS = [req("a", 8, 11, 10), req("b", 30, 12, 10)]
TRUTH = {r.request_id: hf_greedy(r.prompt_ids, r.max_tokens) for r in REQS}


def check(cls):
    h = make(cls)
    outs = h.generate(REQS)
    got = {o.request_id: list(o.token_ids) for o in outs}
    bad = [(k, got[k], TRUTH[k]) for k in TRUTH if got[k] != TRUTH[k]]
    return not bad, f"prompts 8 and 30 decoding together, 10 tokens; wrong (id, got, truth HF): {bad}"


run("p01", check, Host)
