"""p03: Qwen3 q/k norm after rotary. Truth: transformers greedy decoding on a tiny Qwen3."""
from _common import *

PATH = custom_model("qwen3", arch="qwen3")
P = prompt(12, 31)
TRUTH = hf_greedy_at(PATH, P, 8)


def check(cls):
    h = make_at(cls, PATH)
    got = list(h.generate([ClientRequest("a", P, 8)])[0].token_ids)
    return got == TRUTH, f"tiny Qwen3, prompt 12, 8 tokens: truth (HF) {TRUTH}; got {got}"


run("p03", check, host_module("03").Host)
