"""p15: two samples with identical tokens offered in one step must each run (or be refused in the record)."""
from _common import *  # noqa: F403

Host = host_module("15").Host
S1 = sample(1, 10)
S2 = FineTuneSample(2, S1.input_ids, S1.loss_mask)


def check(cls):
    h, ic, sk, rec, ran = idle_capture(cls, [S1, S2])
    r = rec.records[0]
    seen = sorted({e[3] for e in sk.layers()})
    reported = sorted(r.finetune_sample_ids + r.aborted_sample_ids)
    ok = reported == [1, 2] and seen == [1, 2]
    return ok, (f"samples 1 and 2 (same 10 tokens) in one step (ran={ran}): record completed {r.finetune_sample_ids} "
                f"aborted {r.aborted_sample_ids}; captured ids {seen}")


run("p15", check, Host)
