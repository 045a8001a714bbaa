"""p25: a request queued on job@v1 when job@v1 is retracted is still served, on job@v1's weights (PEFT truth)."""
from _common import *  # noqa: F401,F403

H = host_module("25").Host


def check(cls):
    h = make(cls)
    n1 = h.publish_adapter(ft_state(seed=7, version=1))
    n2 = h.publish_adapter(ft_state(seed=8, version=2))
    p = prompt(12, 161)
    h.submit(ClientRequest("a", p, 8, adapter=n1))
    h.retract_adapter(n1)
    outs = drain(h)
    got = [list(o.token_ids) for o in outs if o.request_id == "a"]
    truth = hf_greedy(p, 8, adapter_dir("ft", seed=7))
    return got == [truth], f"published {n1}, {n2}; submit a on {n1}, retract {n1} before any step: truth (PEFT " \
                           f"seed 7) {truth}; outputs for a {got}"


run("p25", check, H)
