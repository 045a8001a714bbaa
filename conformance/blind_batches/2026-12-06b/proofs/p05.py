"""p05: greedy generation on a tiny checkpoint with generation_config.json repetition_penalty 1.3 equals transformers' argmax decoding."""
from _common import *  # noqa: F403

PATH = custom_model("reppen", gen_config={"repetition_penalty": 1.3})
P = prompt(20, 31)
N = 12


def check(cls):
    h = make_at(cls, PATH)
    got = list(h.generate([ClientRequest("a", P, N)])[0].token_ids)
    truth = hf_greedy_at(PATH, P, N)
    return got == truth, f"generation_config.json repetition_penalty 1.3, prompt 20, {N} tokens: truth (HF argmax) {truth}; got {got}"


run("p05", check, host_module("05").Host)
