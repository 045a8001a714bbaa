"""p21: an ignore_eos=False request whose greedy continuation holds the pad id (0) but no EOS runs to max_tokens
(truth: HF greedy argmax of prompt(10, 103))."""
from _common import *

p = prompt(10, 103)
truth = cut_at_eos(hf_greedy(p, 6))
assert 0 in truth and len(truth) == 6, truth


def check(cls):
    h = make(cls)
    got = list(h.generate([ClientRequest("a", p, 6, ignore_eos=False)])[0].token_ids)
    return got == truth, f"ignore_eos=False, max_tokens 6 (pad id 0 at index 1): truth {truth}; got {got}"


run("p21", check, host_module("21").Host)
