"""p05: greedy tokens of a 300-token prompt equal HF greedy argmax."""
from _common import *

p = prompt(300, 3)
truth = hf_greedy(p, 6)


def check(cls):
    h = make(cls)
    got = list(h.generate([ClientRequest("a", p, 6)])[0].token_ids)
    return got == truth, f"prompt 300, 6 tokens: truth {truth}; got {got}"


run("p05", check, host_module("05").Host)
