"""p02: after publishing job@v2, a request on job@v1 is served job@v1's weights (PEFT truth)."""
from _common import *  # noqa: F401,F403
from _common import CACHE  # noqa: F401

H = host_module("02").Host


def check(cls):
    h = make(cls)
    n1 = h.publish_adapter(ft_state(seed=7, version=1))
    n2 = h.publish_adapter(ft_state(seed=8, version=2))
    p = prompt(14, 21)
    out = h.generate([ClientRequest("a", p, 8, adapter=n1)])[0]
    truth = hf_greedy(p, 8, adapter_dir("ft", seed=7))
    other = hf_greedy(p, 8, adapter_dir("ft", seed=8))
    got = list(out.token_ids)
    note = " (== job@v2's weights)" if got == other else ""
    return got == truth, f"published {n1}, {n2}; request on {n1}: truth (PEFT seed 7) {truth}; got {got}{note}"


run("p02", check, H)
