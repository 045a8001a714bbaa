"""p31: greedy decoding on a GQA model."""
from _common import *  # noqa: F401,F403

H = host_module("31").Host
PR = prompt(10, 41)


def check(cls):
    h = make(cls)
    truth = hf_greedy(PR, 8)
    got = list(h.generate([ClientRequest("a", PR, 8)])[0].token_ids)
    return got == truth, f"GQA (4 heads, 2 KV heads), prompt 10, 8 tokens: truth {truth}; got {got}"


run("p31", check, H)
