"""p14: ActivationSink.begin_step is called once per step carrying samples, with all of them."""
from _common import *  # noqa: F403

H = host_module("14").Host
SAMPLES = [sample(1, 9), sample(2, 6), sample(3, 12)]


def check(cls):
    h, ic, sk, rec, ran = idle_capture(cls, SAMPLES)
    begins = [e[1:] for e in sk.events if e[0] == "begin"]
    truth = [(rec.records[0].step_id, (1, 2, 3))]
    return ran and begins == truth, f"begin_step calls (step, sample ids) {begins}, truth {truth}"


run("p14", check, H)
