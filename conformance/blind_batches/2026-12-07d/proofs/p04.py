"""p04: greedy tokens of a prompt holding the pad id (0) equal HF greedy argmax."""
from _common import *

p = list(prompt(12, 21))
p[5] = 0
truth = hf_greedy(p, 6)


def check(cls):
    h = make(cls)
    got = list(h.generate([ClientRequest("a", tuple(p), 6)])[0].token_ids)
    return got == truth, f"prompt 12 with pad id 0 at index 5, 6 tokens: truth {truth}; got {got}"


run("p04", check, host_module("04").Host)
