"""p15: every step generate() runs delivers exactly one StepRecord (h15: offline loop without records)."""
from _common import *  # noqa: F403


def check(cls):
    h = make(cls)
    ic, sk, rec = install(h)
    h.generate([req("a", 8, 1, 4), req("b", 5, 2, 2)])
    ran = [b.step_id for b in ic.batches if b.scheduled]
    got = [r.step_id for r in rec.records]
    return got == ran, f"generate() of 2 requests: steps run (offered with rows) {ran}; records {got}"


run("p15", check, host_module("15").Host)
