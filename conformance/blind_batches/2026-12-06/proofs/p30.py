"""p30: after a republish of the same name, no KV of the first weights is served."""
from _common import *  # noqa: F401,F403

from deltaserve_core.adapter_state import LoraAdapterState

Base = base_module("_prefix_cache").PrefixCacheHost
H = host_module("30").Host
PR = prompt(40, 9)


def check(cls):
    h = make(cls)
    s1 = ft_state(seed=FT_ADAPTER_SEED, version=3)
    s2 = LoraAdapterState.load_pretrained(adapter_dir("ft", seed=8), name="job", version=3)
    n1 = h.publish_adapter(s1)
    h.generate([ClientRequest("a", PR, 5, adapter=n1)])
    n2 = h.publish_adapter(s2)
    got = list(h.generate([ClientRequest("b", PR, 5, adapter=n2)])[0].token_ids)
    truth = hf_greedy(PR, 5, adapter=adapter_dir("ft", seed=8))
    old = hf_greedy(PR, 5, adapter=adapter_dir("ft", seed=FT_ADAPTER_SEED))
    return (n1 == n2 and got == truth,
            f"names {n1!r}, {n2!r}; 40-token prompt on the republished name: got {got}, truth (second weights) {truth} "
            f"(first weights give {old})")


run_with_base("p30", check, Base, H)
