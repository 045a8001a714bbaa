"""p09: the arrival time given to on_arrival and in ScheduledRequest is time.monotonic() at submission."""
import time

from _common import ClientRequest, drain, host_module, install, make, prompt, run


def check(cls):
    h = make(cls)
    ic, sk, rec = install(h)
    t0 = time.monotonic()
    h.submit(ClientRequest("r", prompt(6, 2), 3))
    t1 = time.monotonic()
    drain(h)
    arr = [t for rid, t in ic.arrivals if rid == "r"]
    sched = [q.arrival_time for b in ic.batches for q in b.scheduled + b.waiting if q.request_id == "r"]
    ok = len(arr) == 1 and t0 <= arr[0] <= t1 and sched and all(t0 <= t <= t1 for t in sched)
    return ok, f"submitted in [{t0:.3f}, {t1:.3f}] (monotonic); on_arrival {arr}, ScheduledRequest {sched[:2]}"


run("p09", check, host_module("09").Host)
