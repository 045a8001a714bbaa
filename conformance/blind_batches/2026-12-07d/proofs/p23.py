"""p23: the same prompt twice in one generate() (a and b, base model): both equal HF greedy argmax."""
from _common import *

p = prompt(12, 5)
truth = hf_greedy(p, 6)


def check(cls):
    h = make(cls)
    out = h.generate([ClientRequest("a", p, 6), ClientRequest("b", p, 6)])
    got = [list(o.token_ids) for o in out]
    return got == [truth, truth], f"one prompt twice: truth {truth}; got {got}"


run("p23", check, host_module("23").Host)
