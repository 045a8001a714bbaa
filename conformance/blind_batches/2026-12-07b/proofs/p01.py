"""p01: a max_tokens=1 request returns exactly one token, the HF greedy one."""
from _common import *  # noqa: F401,F403
from _common import CACHE  # noqa: F401

H = host_module("01").Host


def check(cls):
    h = make(cls)
    p = prompt(12, 5)
    out = h.generate([ClientRequest("a", p, 1)])[0]
    truth = hf_greedy(p, 1)
    return list(out.token_ids) == truth, f"prompt 12, max_tokens 1: truth (HF) {truth}; got {list(out.token_ids)}"


run("p01", check, H)
