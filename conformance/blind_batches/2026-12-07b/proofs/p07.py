"""p07: a lone request's greedy tokens match HF."""
from _common import *  # noqa: F401,F403
from _common import CACHE  # noqa: F401

H = host_module("07").Host


def check(cls):
    h = make(cls)
    p = prompt(12, 51)
    got = list(h.generate([ClientRequest("a", p, 10)])[0].token_ids)
    truth = hf_greedy(p, 10)
    return got == truth, f"prompt 12, 10 tokens: truth (HF) {truth}; got {got}"


run("p07", check, H)
