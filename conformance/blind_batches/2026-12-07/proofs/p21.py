"""p21: a request on a client adapter (q, k, v, o) must get PEFT's greedy tokens."""
from _common import *  # noqa: F403

Host = host_module("21").Host
CL = adapter_dir("cl", seed=3)
A = req("a", 12, 211, 10, adapter="cl")
TRUTH = hf_greedy(A.prompt_ids, 10, adapter=CL)


def check(cls):
    got = list(make(cls, client_adapters={"cl": str(CL)}).generate([A])[0].token_ids)
    return got == TRUTH, f"'cl' (q, k, v, o; r 8), prompt 12, 10 tokens: truth (PEFT) {TRUTH}; got {got}"


run("p21", check, Host)
