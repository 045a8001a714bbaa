"""p27: run_idle_step returns True exactly when a step ran (driver.py, HostDriver.run_idle_step)."""
import _common as c


def check(cls):
    s1 = c.sample(1, 10)
    h, ic, sk, rec, ran = c.idle_capture(cls, [s1])
    n = len(rec.records)
    ok = ran is True and n == 1 and rec.records[0].finetune_sample_ids == (1,)
    return ok, f"interceptor added sample 1: run_idle_step() -> {ran}; records delivered {n} (ran {[r.finetune_sample_ids for r in rec.records]})"


c.run("p27", check, c.host_module("27").Host)
