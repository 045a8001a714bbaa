"""p05: a published rank-8 version served in one step with a rank-4 client adapter must serve its own weights."""
from _common import *  # noqa: F403

Host = host_module("05").Host
CL4 = adapter_dir("cl4", seed=3, r=4)
FT = adapter_dir("ft", seed=FT_ADAPTER_SEED)
A, B = req("a", 10, 51, 8, adapter="cl4"), req("b", 12, 52, 8)
TRUTH = {"a": hf_greedy(A.prompt_ids, 8, adapter=CL4), "b": hf_greedy(B.prompt_ids, 8, adapter=FT)}


def check(cls):
    h = make(cls, client_adapters={"cl4": str(CL4)})
    name = h.publish_adapter(ft_state(seed=FT_ADAPTER_SEED))
    outs = h.generate([A, ClientRequest("b", B.prompt_ids, 8, adapter=name)])
    got = {o.request_id: list(o.token_ids) for o in outs}
    bad = [(k, got.get(k), TRUTH[k]) for k in TRUTH if got.get(k) != TRUTH[k]]
    return not bad, f"'cl4' (r 4) and '{name}' (r 8) in one generate(); wrong (id, got, truth PEFT): {bad}"


run("p05", check, Host)
