"""p26: step() runs at most one engine step (driver.py, HostDriver.step)."""
import _common as c


def check(cls):
    h = c.make(cls)
    ic, sk, rec = c.install(h)
    h.submit(c.req("r", 6, 17, 4))
    outs = h.step()
    n = len(rec.records)
    return n <= 1 and len(ic.batches) <= 1, (f"one step() call: {n} step record(s), {len(ic.batches)} on_schedule "
                                             f"call(s), returned {[o.request_id for o in outs]}")


c.run("p26", check, c.host_module("26").Host)
