"""p01: a request whose context passes 256 tokens decodes the HF greedy continuation (h01: last KV partition only)."""
from _common import *  # noqa: F403

P = prompt(300, 11)
N = 8


def check(cls):
    h = make(cls)
    got = list(h.generate([ClientRequest("long", P, N)])[0].token_ids)
    truth = hf_greedy(P, N)
    return got == truth, f"prompt 300 tokens (contexts 300..{300 + N - 1} > 256), {N} tokens: truth {truth}; got {got}"


run("p01", check, host_module("01").Host)
