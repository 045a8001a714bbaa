"""p18: captures are the residual-stream input of every decoder layer (PEFT hidden_states[layer])."""
from _common import *  # noqa: F403

H = host_module("18").Host
SAMPLES = [sample(1, 9), sample(2, 14)]


def check(cls):
    h, ic, sk, rec, ran = idle_capture(cls, SAMPLES)
    bad = capture_problems(h, sk, SAMPLES)
    return ran and not bad, f"{len(sk.layers())} captures: {bad[:3] or 'all match PEFT'}"


run("p18", check, H)
