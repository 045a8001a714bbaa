"""p17: prefill lengths deduplicated. Truth: arithmetic over the prompts submitted together."""
from _common import *


def check(cls):
    h = make(cls)
    ic, sk, rec = install(h)
    reqs = [req("a", 10, 171, 2), req("b", 10, 172, 2), req("c", 7, 173, 2)]
    h.generate(reqs)
    first = rec.records[0]
    return sorted(first.prefill_lengths) == [7, 10, 10], f"prompts 10, 10, 7 in one step; record prefill_lengths {first.prefill_lengths}"


run("p17", check, host_module("17").Host)
