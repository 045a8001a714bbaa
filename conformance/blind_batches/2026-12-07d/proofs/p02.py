"""p02: an ignore_eos=False request stops at the first EOS it generates, EOS included as its last token (truth: HF
greedy argmax of prompt(10, 44), whose continuation holds EOS at index 3, cut there)."""
from _common import *

p = prompt(10, 44)
full = hf_greedy(p, 8)
truth = cut_at_eos(full)
assert len(truth) < 8, full


def check(cls):
    h = make(cls)
    got = list(h.generate([ClientRequest("a", p, 8, ignore_eos=False)])[0].token_ids)
    return got == truth, f"ignore_eos=False, max_tokens 8: truth {truth}; got {got}"


run("p02", check, host_module("02").Host)
