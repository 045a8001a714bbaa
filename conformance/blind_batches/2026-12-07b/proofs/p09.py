"""p09: a request on a published version (q, k, v, o) matches PEFT greedy."""
from _common import *  # noqa: F401,F403
from _common import CACHE  # noqa: F401

H = host_module("09").Host


def check(cls):
    h = make(cls)
    name = h.publish_adapter(ft_state(seed=7, version=3))
    p = prompt(14, 71)
    got = list(h.generate([ClientRequest("a", p, 10, adapter=name)])[0].token_ids)
    truth = hf_greedy(p, 10, adapter_dir("ft", seed=7))
    return got == truth, f"{name!r} (q, k, v, o; r 8), prompt 14, 10 tokens: truth (PEFT) {truth}; got {got}"


run("p09", check, H)
