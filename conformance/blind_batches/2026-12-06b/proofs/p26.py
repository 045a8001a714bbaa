"""p26: greedy generation on a tiny checkpoint with rope_theta 1e6 equals transformers' argmax decoding."""
from _common import *  # noqa: F403

PATH = custom_model("theta", rope_parameters={"rope_type": "default", "rope_theta": 1000000.0})
P = prompt(20, 31)
N = 12


def check(cls):
    h = make_at(cls, PATH)
    got = list(h.generate([ClientRequest("a", P, N)])[0].token_ids)
    truth = hf_greedy_at(PATH, P, N)
    return got == truth, f"rope_theta 1e6, prompt 20, {N} tokens: truth (HF argmax) {truth}; got {got}"


run("p26", check, host_module("26").Host)
