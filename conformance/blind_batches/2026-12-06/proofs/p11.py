"""p11: captures of a 300-token fine-tuning sample equal PEFT's layer inputs."""
from _common import *  # noqa: F401,F403

H = host_module("11").Host
SMP = sample(1, 300)


def check(cls):
    h, ic, sk, rec, ran = idle_capture(cls, [SMP])
    bad = capture_problems(h, sk, [SMP])
    return ran and not bad, f"300-token sample, FT-only step ran={ran}; captures vs PEFT: {bad or 'all match'}"


run("p11", check, H)
