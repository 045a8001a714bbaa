"""p12: the step's duration is the forward's: it starts after on_schedule returned (the core took 0.3 s)."""
import time

from _common import *  # noqa: F403

RETURNED = []


def plan(b, i):
    time.sleep(0.3)  # a slow admission decision: not part of the forward
    RETURNED.append(time.monotonic())
    return ()


def check(cls):
    RETURNED.clear()
    h = make(cls)
    ic, sk, rec = install(h, plan=plan)
    h.generate([ClientRequest("a", prompt(8, 1), 2)])
    bad = [f"step {r.step_id}: start {r.start_time - t:+.3f}s from on_schedule's return, duration {r.duration_s:.3f}s"
           for r, t in zip(rec.records, RETURNED) if r.start_time < t or r.duration_s >= 0.3]
    return not bad and len(rec.records) == 2, "forward-only durations" if not bad else "; ".join(bad)


run("p12", check, host_module("12").Host)
