"""p18: job@v3 published, r decoding on it, job@v3 retracted and published again with other weights (restart) before
r finishes: after r finished, a request on job@v3 is served with the republished weights (truth: PEFT greedy with
that adapter)."""
from _common import *

first, second = ft_state(seed=7, version=3), ft_state(seed=9, version=3)
p = prompt(12, 5)
truth = hf_greedy(p, 4, adapter=adapter_dir("ft", seed=9))


def check(cls):
    h = make(cls)
    name = h.publish_adapter(first)
    h.submit(ClientRequest("r", prompt(10, 8), 5, adapter=name))
    h.step()
    h.retract_adapter(name)
    again = h.publish_adapter(second)
    drain(h)
    try:
        got = list(h.generate([ClientRequest("s", p, 4, adapter=again)])[0].token_ids)
    except Exception as exc:  # noqa: BLE001
        return False, f"{name!r} republished as {again!r}; request on it after r finished: {type(exc).__name__}: {exc}"
    return got == truth, f"{again!r} after r finished: truth {truth}; got {got}"


run("p18", check, host_module("18").Host)
