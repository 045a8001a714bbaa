"""p06: a client adapter with lora_alpha 32 (r 8) serves PEFT's greedy continuation (h06: scaling from alpha 16)."""
from _common import *  # noqa: F403

CL = build_lora_adapter(model_dir(2), CACHE / "lora_cl_alpha32", r=8, lora_alpha=32.0, seed=3, scale=0.08)
P = prompt(12, 41)
N = 10


def check(cls):
    h = make(cls, client_adapters={"cl": str(CL)})
    got = list(h.generate([ClientRequest("a", P, N, adapter="cl")])[0].token_ids)
    truth = hf_greedy(P, N, adapter=CL)
    return got == truth, f"client adapter 'cl' (r 8, lora_alpha 32): truth (PEFT) {truth}; got {got}"


run("p06", check, host_module("06").Host)
