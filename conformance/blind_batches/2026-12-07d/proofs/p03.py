"""p03: a default request (ignore_eos=True) and an ignore_eos=False request in one generate(): each follows its own
flag (truth: HF greedy for a, 8 tokens; HF greedy for b cut at its first EOS)."""
from _common import *

pa, pb = prompt(12, 5), prompt(10, 44)
ta, tb = hf_greedy(pa, 8), cut_at_eos(hf_greedy(pb, 8))
assert len(tb) < 8


def check(cls):
    h = make(cls)
    out = h.generate([ClientRequest("a", pa, 8), ClientRequest("b", pb, 8, ignore_eos=False)])
    got = [list(o.token_ids) for o in out]
    return got == [ta, tb], f"a (ignore_eos=True) then b (ignore_eos=False): truth {[ta, tb]}; got {got}"


run("p03", check, host_module("03").Host)
