"""p31: a request's outputs are the greedy outputs of the model with its own adapter, whatever other requests
shared its prompt (driver.py, ClientRequest). Truth: transformers (+ PEFT) greedy decoding. Reference: the reference
host and the batch's correct prefix-cache host (_prefix_cache.PrefixCacheHost)."""
import _common as c
from blindhosts._prefix_cache import PrefixCacheHost


def check(cls):
    cl = c.adapter_dir("cl", seed=3)
    h = c.make(cls, client_adapters={"cl": str(cl)})
    p = c.prompt(40, 22)
    ob = h.generate([c.ClientRequest("base", p, 5)])[0]
    oa = h.generate([c.ClientRequest("on_cl", p, 5, adapter="cl")])[0]
    tb = c.hf_greedy(p, 5)
    ta = c.hf_greedy(p, 5, adapter=cl)
    ok = list(ob.token_ids) == tb and list(oa.token_ids) == ta
    return ok, f"same 40-token prompt, base then 'cl': 'cl' got {list(oa.token_ids)}, truth (PEFT 'cl') {ta} (base {tb})"


ok1, m1 = check(c.ReferenceHost)
ok2, m2 = check(PrefixCacheHost)
okb, mb = check(c.host_module("31").Host)
c.verdict("p31", ok1 and ok2, f"reference: {m1} | correct prefix-cache host: {m2}", okb, mb)
