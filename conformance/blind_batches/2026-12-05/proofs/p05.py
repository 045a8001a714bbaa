"""p05: on_schedule is called exactly once per step, decode-only steps included (hooks.py, on_schedule)."""
import _common as c


def check(cls):
    h = c.make(cls)
    ic, sk, rec = c.install(h)
    h.submit(c.req("r", 6, 4, 5))
    c.drain(h)
    offered = [b.step_id for b in ic.batches]
    ran = [r.step_id for r in rec.records]
    ok = offered == ran and len(set(offered)) == len(offered)
    return ok, f"steps executed {ran}, steps offered to on_schedule {offered}; declared mixed_batches={h.capabilities().mixed_batches}"


c.run("p05", check, c.host_module("05").Host)
