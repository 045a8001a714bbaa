"""p04: greedy generation on a tiny checkpoint with tie_word_embeddings=True equals transformers' argmax decoding."""
from _common import *  # noqa: F403

PATH = custom_model("tied", tie_word_embeddings=True)
P = prompt(20, 31)
N = 12


def check(cls):
    h = make_at(cls, PATH)
    got = list(h.generate([ClientRequest("a", P, N)])[0].token_ids)
    truth = hf_greedy_at(PATH, P, N)
    return got == truth, f"tie_word_embeddings=True, prompt 20, {N} tokens: truth (HF argmax) {truth}; got {got}"


run("p04", check, host_module("04").Host)
