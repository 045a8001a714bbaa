"""p21: a request on a client LoRA adapter is decoded greedily (truth: transformers + PEFT greedy decoding)."""
from _common import ClientRequest, adapter_dir, hf_greedy, host_module, make, prompt, run

A = adapter_dir("client", seed=3)
P, N = prompt(6, 41), 6
TRUTH = hf_greedy(P, N, A)


def check(cls):
    h = make(cls, client_adapters={"a": str(A)})
    got = list(h.generate([ClientRequest("r", P, N, adapter="a")])[0].token_ids)
    return got == TRUTH, f"got {got}, truth {TRUTH}"


run("p21", check, host_module("21").Host)
