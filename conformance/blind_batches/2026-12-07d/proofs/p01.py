"""p01: an ignore_eos=False request whose prompt holds the EOS id returns its greedy tokens up to the first EOS it
generates (truth: HF greedy argmax, cut at the first generated EOS)."""
from _common import *

p = list(prompt(10, 11))
p[4] = EOS_ID
truth = cut_at_eos(hf_greedy(p, 6))
assert len(truth) > 1, truth


def check(cls):
    h = make(cls)
    got = list(h.generate([ClientRequest("a", tuple(p), 6, ignore_eos=False)])[0].token_ids)
    return got == truth, f"prompt 10 with EOS at index 4, ignore_eos=False, max_tokens 6: truth {truth}; got {got}"


run("p01", check, host_module("01").Host)
