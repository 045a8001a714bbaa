"""p11: every request id the scheduler reports (scheduled or waiting) is the id of a submitted client request,
the one on_arrival announced."""
from _common import ClientRequest, drain, host_module, install, make, prompt, run


def check(cls):
    h = make(cls)
    ic, sk, rec = install(h)
    ids = {"a", "b"}
    h.submit(ClientRequest("a", prompt(6, 1), 4))
    h.step()
    h.submit(ClientRequest("b", prompt(5, 2), 3))
    drain(h)
    arrived = {rid for rid, _ in ic.arrivals}
    seen = {q.request_id for b in ic.batches for q in b.scheduled + b.waiting}
    ok = arrived == ids and seen == ids
    return ok, f"on_arrival ids {sorted(arrived)}, ScheduledRequest ids {sorted(seen)}, submitted {sorted(ids)}"


run("p11", check, host_module("11").Host)
