"""p03: greedy generation on a tiny checkpoint with attention_bias=True (q/k/v biases) equals transformers' argmax decoding."""
from _common import *  # noqa: F403

PATH = custom_model("bias", attention_bias=True)
P = prompt(20, 31)
N = 12


def check(cls):
    h = make_at(cls, PATH)
    got = list(h.generate([ClientRequest("a", P, N)])[0].token_ids)
    truth = hf_greedy_at(PATH, P, N)
    return got == truth, f"attention_bias=True (q/k/v biases), prompt 20, {N} tokens: truth (HF argmax) {truth}; got {got}"


run("p03", check, host_module("03").Host)
