"""p18: a request on published v1 keeps v1's weights to its end when v2 is published meanwhile (PEFT truth)."""
from _common import *  # noqa: F403


def check(cls):
    h = make(cls)
    v1 = h.publish_adapter(ft_state(seed=7, version=1))
    p = prompt(8, 1)
    h.submit(ClientRequest("a", p, 6, adapter=v1))
    outs = h.step() + h.step()
    v2 = h.publish_adapter(ft_state(seed=9, version=2))
    while h.has_unfinished():
        outs += h.step()
    truth = hf_greedy(p, 6, adapter_dir("ft", seed=7))
    got = list(outs[0].token_ids)
    return got == truth and v1 != v2, f"{v1} request got {got}, PEFT truth {truth} (then published {v2})"


run("p18", check, host_module("18").Host)
