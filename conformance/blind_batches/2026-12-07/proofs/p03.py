"""p03: decoding requests' greedy tokens must be HF's."""
from _common import *  # noqa: F403

Host = host_module("03").Host
REQS = [req("a", 20, 32, 12), req("b", 15, 33, 12), req("c", 25, 34, 12)]
TRUTH = {r.request_id: hf_greedy(r.prompt_ids, 12) for r in REQS}


def check(cls):
    got = {o.request_id: list(o.token_ids) for o in make(cls).generate(REQS)}
    bad = [(k, got[k], TRUTH[k]) for k in TRUTH if got[k] != TRUTH[k]]
    return not bad, f"prompts 20, 15, 25, 12 tokens each; wrong (id, got, truth HF argmax): {bad}"


run("p03", check, Host)
