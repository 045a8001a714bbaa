"""p28: a fine-tuning-only step with nothing queued asks should_abort at each of its 2 layer boundaries."""
from _common import *  # noqa: F401,F403

H = host_module("28").Host


def check(cls):
    h, ic, sk, rec, ran = idle_capture(cls, [sample(1, 10)])
    asked = [e[1] for e in sk.events if e[0] == "abort?"]
    steps = [e[1] for e in sk.events if e[0] == "begin"]
    L = h.model_spec().num_layers
    return asked == steps * L and ran, f"FT-only step {steps} of a {L}-layer model, nothing queued: should_abort asked " \
                                      f"for steps {asked}"


run("p28", check, H)
