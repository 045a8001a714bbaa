"""p01: rope_scaling ignored. Truth: transformers greedy decoding on a tiny Llama with Llama-3.2's rope_parameters."""
from _common import *

ROPE = {"rope_type": "llama3", "rope_theta": 500000.0, "factor": 32.0, "low_freq_factor": 1.0,
        "high_freq_factor": 4.0, "original_max_position_embeddings": 8192}
PATH = custom_model("llama32rope", rope_parameters=ROPE, max_position_embeddings=131072)
P = prompt(400, 5)
N = 12
TRUTH = hf_greedy_at(PATH, P, N)


def check(cls):
    h = make_at(cls, PATH)
    got = list(h.generate([ClientRequest("a", P, N)])[0].token_ids)
    return got == TRUTH, f"prompt 400 on rope_type llama3 (factor 32), {N} tokens: truth (HF) {TRUTH}; got {got}"


run("p01", check, host_module("01").Host)
