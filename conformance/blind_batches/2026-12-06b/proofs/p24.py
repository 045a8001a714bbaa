"""p24: greedy generation on a tiny checkpoint with Qwen3ForCausalLM (q_norm / k_norm) equals transformers' argmax decoding."""
from _common import *  # noqa: F403

PATH = custom_model("qwen3", arch="qwen3")
P = prompt(20, 31)
N = 12


def check(cls):
    h = make_at(cls, PATH)
    got = list(h.generate([ClientRequest("a", P, N)])[0].token_ids)
    truth = hf_greedy_at(PATH, P, N)
    return got == truth, f"Qwen3ForCausalLM (q_norm / k_norm), prompt 20, {N} tokens: truth (HF argmax) {truth}; got {got}"


run("p24", check, host_module("24").Host)
