"""p35: a record's [start_time, start_time + duration_s] is the forward: it starts before the step's token
exists and ends before the record is delivered."""
import time

from _common import *  # noqa: F403


def check(cls):
    h = make(cls)
    ic, sk, rec = install(h)
    got = []
    h.report_step_time(lambda r: got.append((r, time.monotonic())))
    out = h.generate([ClientRequest("a", prompt(8, 1), 2)])[0]
    bad = [f"step {r.step_id}: starts {r.start_time - tok:+.6f}s after its token, ends {r.start_time + r.duration_s - t:+.6f}s "
           "after delivery" for (r, t), tok in zip(got, out.token_times)
           if r.start_time > tok or r.start_time + r.duration_s > t]
    return not bad and len(got) == 2, "step windows right" if not bad else "; ".join(bad)


run("p35", check, host_module("35").Host)
