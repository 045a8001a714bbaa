"""p03: a client adapter of r 16, lora_alpha 24 (scaling 1.5) serves its PEFT outputs."""
from _common import *  # noqa: F401,F403
from _common import CACHE  # noqa: F401

H = host_module("03").Host
ADAPTER = build_lora_adapter(model_dir(2), CACHE / "lora_a24_r16", r=16, lora_alpha=24.0, seed=3, scale=0.08)


def check(cls):
    h = make(cls, client_adapters={"cl": str(ADAPTER)})
    p = prompt(14, 31)
    out = h.generate([ClientRequest("a", p, 10, adapter="cl")])[0]
    truth = hf_greedy(p, 10, ADAPTER)
    got = list(out.token_ids)
    return got == truth, f"'cl' (r 16, alpha 24), prompt 14: truth (PEFT) {truth}; got {got}"


run("p03", check, H)
