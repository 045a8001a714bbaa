"""h34: after intercept_schedule(None) the old interceptor is never called again."""
import sys
import _common as c


def check(cls):
    h = c.make(cls)
    ic, sink, recs = c.install(h, policy=lambda b: (c.sample(26, 8),))
    h.intercept_schedule(None)
    h.generate([c.ClientRequest("r", c.prompt(5), 2)])
    h.run_idle_step()
    return (not ic.batches and not ic.arrivals), f"old interceptor calls: {len(ic.batches)} on_schedule, {len(ic.arrivals)} on_arrival"


sys.exit(c.verdict(check, "34"))
