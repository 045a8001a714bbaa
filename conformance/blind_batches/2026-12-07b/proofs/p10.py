"""p10: captures of a fine-tuning-only step equal the PEFT model's layer inputs."""
from _common import *  # noqa: F401,F403
from _common import CACHE  # noqa: F401

H = host_module("10").Host


def check(cls):
    samples = [sample(1, 12)]
    h, ic, sk, rec, ran = idle_capture(cls, samples)
    bad = capture_problems(h, sk, samples)
    return not bad and ran, f"sample 1 (12 tokens) alone (ran={ran}); captures vs PEFT: {bad}"


run("p10", check, H)
