"""p09: every StepRecord.start_time is a time.monotonic() time between its batch's offer and the end of the run."""
from _common import *  # noqa: F403


def check(cls):
    h = make(cls)
    ic, sk, rec = install(h)
    t0 = time.monotonic()
    h.generate([req("a", 8, 1, 4), req("b", 6, 2, 3)])
    t1 = time.monotonic()
    now = {b.step_id: b.now for b in ic.batches}
    bad = [(r.step_id, round(r.start_time, 3)) for r in rec.records
           if not (now.get(r.step_id, t0) <= r.start_time <= t1)]
    return not bad, (f"{len(rec.records)} records, monotonic window [{t0:.3f}, {t1:.3f}]; start_time outside "
                     f"[batch.now, end] (step, start_time): {bad[:4]}")


run("p09", check, host_module("09").Host)
