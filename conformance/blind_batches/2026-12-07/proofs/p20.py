"""p20: a request whose sequence passes 512 tokens must keep HF's greedy tokens."""
from _common import *  # noqa: F403

Host = host_module("20").Host
A = req("a", 505, 201, 16)
TRUTH = hf_greedy(A.prompt_ids, 16)


def check(cls):
    got = list(make(cls).generate([A])[0].token_ids)
    return got == TRUTH, f"prompt 505, 16 tokens (positions 505..520): truth (HF argmax) {TRUTH}; got {got}"


run("p20", check, Host)
