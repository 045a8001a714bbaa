"""p30: a published name never serves KV computed with older weights (hooks.py, HostHooks.publish_adapter).
Truth: transformers + PEFT greedy decoding with the second version's weights. Reference: the reference host and
the batch's correct prefix-cache host (_prefix_cache.PrefixCacheHost: versioned names)."""
import _common as c
from blindhosts._prefix_cache import PrefixCacheHost


def check(cls):
    h = c.make(cls)
    p = c.prompt(40, 21)  # two whole blocks cached
    n1 = h.publish_adapter(c.ft_state(seed=7, version=1))
    o1 = h.generate([c.ClientRequest("v1", p, 5, adapter=n1)])[0]
    n2 = h.publish_adapter(c.ft_state(seed=8, version=2))
    o2 = h.generate([c.ClientRequest("v2", p, 5, adapter=n2)])[0]
    t1 = c.hf_greedy(p, 5, adapter=c.adapter_dir("ft", seed=7))
    t2 = c.hf_greedy(p, 5, adapter=c.adapter_dir("ft", seed=8))
    ok = list(o1.token_ids) == t1 and list(o2.token_ids) == t2
    return ok, (f"names {n1!r}, {n2!r}; on the second: got {list(o2.token_ids)}, truth (v2 weights) {t2} "
                f"(v1 weights give {t1})")


ok1, m1 = check(c.ReferenceHost)
ok2, m2 = check(PrefixCacheHost)
okb, mb = check(c.host_module("30").Host)
c.verdict("p30", ok1 and ok2, f"reference: {m1} | correct prefix-cache host: {m2}", okb, mb)
