"""p24: the greedy continuation of prompt_ids exactly as given (truth: transformers greedy decoding)."""
from _common import ClientRequest, hf_greedy, host_module, make, prompt, run

P, N = prompt(6, 51), 5
TRUTH = hf_greedy(P, N)


def check(cls):
    got = list(make(cls).generate([ClientRequest("r", P, N)])[0].token_ids)
    return got == TRUTH, f"got {got}, truth {TRUTH}"


run("p24", check, host_module("24").Host)
