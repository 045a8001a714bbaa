"""p17: greedy tokens of four requests (24 tokens each) match HF."""
from _common import *  # noqa: F401,F403
from _common import CACHE  # noqa: F401

H = host_module("17").Host


def check(cls):
    h = make(cls)
    rs = [req(f"r{i}", 10 + 3 * i, 121 + i, 24) for i in range(4)]
    wrong = []
    for r in rs:
        got = list(h.generate([r])[0].token_ids)
        truth = hf_greedy(r.prompt_ids, 24)
        if got != truth:
            wrong.append((r.request_id, got, truth))
    return not wrong, f"4 prompts (10, 13, 16, 19), 24 tokens each, one at a time; wrong (id, got, truth HF): {wrong}"


run("p17", check, H)
