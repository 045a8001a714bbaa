"""p05: re-publishing a version with new weights serves the new weights under the returned name."""
from _common import *  # noqa: F403

H = host_module("05").Host


def check(cls):
    h = make(cls)
    install(h)
    n1 = h.publish_adapter(ft_state(seed=7, version=3))
    n2 = h.publish_adapter(ft_state(seed=8, version=3))  # restart from an older checkpoint reaches step 3 again
    p = prompt(8, 31)
    out = list(h.generate([ClientRequest("r", p, 6, adapter=n2)])[0].token_ids)
    truth = hf_greedy(p, 6, adapter_dir("ft", seed=8))
    old = hf_greedy(p, 6, adapter_dir("ft", seed=7))
    return out == truth, f"names {n1!r}, {n2!r}: got {out}, truth (second weights) {truth}, first weights give {old}"


run("p05", check, H)
