"""p11: a sample whose last 3 tokens are not targets is captured whole ([12, hidden]) and reported 12 long."""
from _common import *  # noqa: F401,F403
from _common import CACHE  # noqa: F401

H = host_module("11").Host


def check(cls):
    base = sample(1, 12)
    s = FineTuneSample(1, base.input_ids, (False,) + (True,) * 8 + (False,) * 3)
    h, ic, sk, rec, ran = idle_capture(cls, [s])
    bad = capture_problems(h, sk, [s])
    lengths = [r.finetune_lengths for r in rec.records]
    ok = not bad and lengths == [(12,)]
    return ok, f"sample 1: 12 tokens, targets 1..8 (ran={ran}); record lengths {lengths}; captures: {bad}"


run("p11", check, H)
