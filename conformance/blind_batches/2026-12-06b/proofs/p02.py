"""p02: greedy generation on a tiny checkpoint with head_dim 64 (4 heads x 64 != hidden 128) equals transformers' argmax decoding."""
from _common import *  # noqa: F403

PATH = custom_model("hd64", head_dim=64)
P = prompt(20, 31)
N = 12


def check(cls):
    h = make_at(cls, PATH)
    got = list(h.generate([ClientRequest("a", P, N)])[0].token_ids)
    truth = hf_greedy_at(PATH, P, N)
    return got == truth, f"head_dim 64 (4 heads x 64 != hidden 128), prompt 20, {N} tokens: truth (HF argmax) {truth}; got {got}"


run("p02", check, host_module("02").Host)
