"""p05: LoRA segment capped at 256 tokens. Truth: PEFT greedy decoding."""
from _common import *

CL = adapter_dir("cl", seed=3)
P = prompt(300, 51)
TRUTH = hf_greedy(P, 6, adapter=CL)


def check(cls):
    h = make(cls, client_adapters={"cl": str(CL)})
    got = list(h.generate([ClientRequest("a", P, 6, adapter="cl")])[0].token_ids)
    return got == TRUTH, f"'cl' (r 8, q/k/v/o), prompt 300, 6 tokens: truth (PEFT) {TRUTH}; got {got}"


run("p05", check, host_module("05").Host)
