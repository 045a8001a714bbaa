"""p13: each capture is [num_tokens, hidden_size] and equals the PEFT model's layer input."""
from _common import capture_problems, host_module, idle_capture, run, sample

S = sample(1, 10)


def check(cls):
    h, ic, sk, rec, ran = idle_capture(cls, [S])
    bad = capture_problems(h, sk, [S])
    shapes = sorted({tuple(e[4].shape) for e in sk.layers()})
    return not bad and ran, f"capture shapes {shapes}" + ("" if not bad else ": " + "; ".join(bad[:2]))


run("p13", check, host_module("13").Host)
