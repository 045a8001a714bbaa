"""p12: samples 0 and 1 in one step are both captured and both reported completed."""
from _common import *  # noqa: F401,F403
from _common import CACHE  # noqa: F401

H = host_module("12").Host


def check(cls):
    samples = [sample(0, 10), sample(1, 11)]
    h, ic, sk, rec, ran = idle_capture(cls, samples)
    bad = capture_problems(h, sk, samples)
    recs = [(r.finetune_sample_ids, r.aborted_sample_ids) for r in rec.records]
    ends = [e[2:] for e in sk.events if e[0] == "end"]
    ok = not bad and recs == [((0, 1), ())]
    return ok, f"samples 0, 1 (ran={ran}); records (completed, aborted) {recs}; end_step {ends}; captures: {bad}"


run("p12", check, H)
