"""p10: StepRecord.prefill_lengths lists each prefill that ran (one entry per prompt)."""
from _common import *  # noqa: F403

H = host_module("10").Host
LENS = (5, 9, 13)


def check(cls):
    h = make(cls)
    ic, sk, rec = install(h)
    h.generate([ClientRequest(f"r{n}", prompt(n, n), 3) for n in LENS])
    got = [tuple(sorted(r.prefill_lengths)) for r in rec.records]
    truth = [LENS, (), ()]  # one burst: all three prompts prefill in step 0, then two decode steps
    return got == truth, f"records' prefill_lengths {got}, truth {truth}"


run("p10", check, H)
