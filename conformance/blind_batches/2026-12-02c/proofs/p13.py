"""p13: a step's record is delivered after its outputs were processed (its tokens exist when it arrives)."""
import time

from _common import *  # noqa: F403


def check(cls):
    h = make(cls)
    ic, sk, rec = install(h)
    delivered = []
    h.report_step_time(lambda r: delivered.append((r, time.monotonic())))
    out = h.generate([ClientRequest("a", prompt(8, 1), 3)])[0]
    bad = [f"step {r.step_id}: record {t - tok:+.6f}s after its token" for (r, t), tok in zip(delivered, out.token_times)
           if t < tok]
    return not bad and len(delivered) == 3, "records after outputs" if not bad else "; ".join(bad)


run("p13", check, host_module("13").Host)
