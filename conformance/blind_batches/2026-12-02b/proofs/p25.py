"""h25: on_schedule is called once for every executed step, also pure-decode steps of 4 requests."""
import sys
import _common as c


def check(cls):
    h = c.make(cls)
    ic, sink, recs = c.install(h)
    for i in range(4):
        h.submit(c.ClientRequest(f"r{i}", c.prompt(5, i), 4))
    c.drain(h)
    asked = [b.step_id for b in ic.batches]
    ran = [r.step_id for r in recs]
    if asked != ran:
        return False, f"on_schedule for steps {asked}, steps ran {ran}"
    return True, f"{len(ran)} steps, one call each"


sys.exit(c.verdict(check, "25"))
