"""p04: captured layer inputs of a fine-tuning row equal the PEFT model's (adapter on q,k,v,o) hidden states."""
from _common import capture_problems, host_module, idle_capture, run, sample

S = sample(1, 12)


def check(cls):
    h, ic, sk, rec, ran = idle_capture(cls, [S])
    bad = capture_problems(h, sk, [S])
    return not bad and ran, "captures match PEFT" if not bad else "; ".join(bad)


run("p04", check, host_module("04").Host)
