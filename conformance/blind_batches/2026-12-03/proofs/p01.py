"""p01: a request gets exactly max_tokens greedy tokens (truth: transformers greedy decoding)."""
from _common import ClientRequest, hf_greedy, host_module, make, prompt, run

P, N = prompt(7, 11), 5
TRUTH = hf_greedy(P, N)


def check(cls):
    out = make(cls).generate([ClientRequest("r", P, N)])[0]
    got = list(out.token_ids)
    return got == TRUTH, f"max_tokens={N}: got {len(got)} tokens {got}, truth {TRUTH}"


run("p01", check, host_module("01").Host)
