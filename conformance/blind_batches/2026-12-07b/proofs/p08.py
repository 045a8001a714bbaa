"""p08: a request on client adapter 'cl' (q, k, v, o) matches PEFT greedy."""
from _common import *  # noqa: F401,F403
from _common import CACHE  # noqa: F401

H = host_module("08").Host
ADAPTER = adapter_dir("cl", seed=3)


def check(cls):
    h = make(cls, client_adapters={"cl": str(ADAPTER)})
    p = prompt(12, 61)
    got = list(h.generate([ClientRequest("a", p, 10, adapter="cl")])[0].token_ids)
    truth = hf_greedy(p, 10, ADAPTER)
    return got == truth, f"'cl' (q, k, v, o; r 8), prompt 12, 10 tokens: truth (PEFT) {truth}; got {got}"


run("p08", check, H)
