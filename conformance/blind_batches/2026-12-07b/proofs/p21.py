"""p21: retracting job@v1 leaves job@v10 servable, on its own weights (PEFT truth)."""
from _common import *  # noqa: F401,F403
from _common import CACHE  # noqa: F401

H = host_module("21").Host


def check(cls):
    h = make(cls)
    n1 = h.publish_adapter(ft_state(seed=7, version=1))
    n10 = h.publish_adapter(ft_state(seed=8, version=10))
    h.retract_adapter(n1)
    p = prompt(12, 141)
    try:
        got = list(h.generate([ClientRequest("a", p, 8, adapter=n10)])[0].token_ids)
    except ValueError as e:
        return False, f"published {n1}, {n10}; retract {n1}; request on {n10} refused: {e}"
    truth = hf_greedy(p, 8, adapter_dir("ft", seed=8))
    return got == truth, f"published {n1}, {n10}; retract {n1}; {n10}: truth (PEFT) {truth}; got {got}"


run("p21", check, H)
