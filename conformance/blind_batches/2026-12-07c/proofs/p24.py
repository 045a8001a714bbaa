"""p24: generate() pairs outputs by prompt. Truth: request order and HF / PEFT greedy decoding per request."""
from _common import *

CL = adapter_dir("cl", seed=3)
P = prompt(12, 241)
TRUTH = [("a", hf_greedy(P, 6)), ("b", hf_greedy(P, 6, adapter=CL))]


def check(cls):
    h = make(cls, client_adapters={"cl": str(CL)})
    outs = h.generate([ClientRequest("a", P, 6), ClientRequest("b", P, 6, adapter="cl")])
    got = [(o.request_id, list(o.token_ids)) for o in outs]
    return got == TRUTH, f"one prompt on the base (a) and on 'cl' (b): truth {TRUTH}; got {got}"


run("p24", check, host_module("24").Host)
