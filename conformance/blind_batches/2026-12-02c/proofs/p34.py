"""p34: a request on a just-published name is served with the published weights from its first token (PEFT)."""
from _common import *  # noqa: F403


def check(cls):
    h = make(cls)
    name = h.publish_adapter(ft_state(seed=7, version=3))
    p = prompt(8, 1)
    out = h.generate([ClientRequest("a", p, 4, adapter=name)])[0]
    truth = hf_greedy(p, 4, adapter_dir("ft", seed=7))
    return list(out.token_ids) == truth, f"{name}: got {list(out.token_ids)}, PEFT truth {truth}"


run("p34", check, host_module("34").Host)
