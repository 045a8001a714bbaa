"""p28: base-model requests sharing a step with a client-LoRA request decode the base model."""
from _common import *  # noqa: F401,F403

H = host_module("28").Host
CL = adapter_dir("cl", seed=3)
PB, PL = prompt(10, 4), prompt(10, 5)


def check(cls):
    h = make(cls, client_adapters={"cl": str(CL)})
    outs = h.generate([ClientRequest("base", PB, 6), ClientRequest("lora", PL, 6, adapter="cl")])
    tb, tl = hf_greedy(PB, 6), hf_greedy(PL, 6, adapter=CL)
    gb, gl = list(outs[0].token_ids), list(outs[1].token_ids)
    return (gb == tb and gl == tl,
            f"base request: got {gb}, truth (HF base) {tb}; 'cl' request: got {gl}, truth (PEFT cl) {tl}")


run("p28", check, H)
