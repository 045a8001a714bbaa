"""p04: rows of adapter 'cl' that are not contiguous in a step (prefill on cl, base decode, cl decode) must each
get their own adapter."""
from _common import *  # noqa: F403

Host = host_module("04").Host
CL = adapter_dir("cl", seed=3)
A, C, B = req("a", 10, 41, 8), req("c", 11, 42, 8, adapter="cl"), req("b", 9, 43, 6, adapter="cl")
TRUTH = {"a": hf_greedy(A.prompt_ids, 8), "c": hf_greedy(C.prompt_ids, 8, adapter=CL),
         "b": hf_greedy(B.prompt_ids, 6, adapter=CL)}


def check(cls):
    h = make(cls, client_adapters={"cl": str(CL)})
    h.submit(A)
    outs = h.step()
    h.submit(C)
    outs += h.step()
    h.submit(B)  # step 2 rows: prefill b (cl), decode a (base), decode c (cl)
    outs += drain(h)
    got = {o.request_id: list(o.token_ids) for o in outs}
    bad = [(k, got.get(k), TRUTH[k]) for k in TRUTH if got.get(k) != TRUTH[k]]
    return not bad, f"a (base), c (cl), b (cl) staggered by one step; wrong (id, got, truth HF/PEFT): {bad}"


run("p04", check, Host)
