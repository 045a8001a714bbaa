"""p18: captures of a fine-tuning-only step equal the PEFT model's layer inputs (tolerance 1e-5)."""
from _common import *  # noqa: F401,F403
from _common import CACHE  # noqa: F401

H = host_module("18").Host


def check(cls):
    samples = [sample(1, 16)]
    h, ic, sk, rec, ran = idle_capture(cls, samples)
    bad = capture_problems(h, sk, samples, tol=1e-5)
    return not bad and ran, f"sample 1 (16 tokens) alone (ran={ran}); captures vs PEFT (tol 1e-5): {bad}"


run("p18", check, H)
