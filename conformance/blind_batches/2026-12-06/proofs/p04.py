"""p04: ClientOutput.arrival_time is when submit accepted the request."""
from _common import *  # noqa: F401,F403

H = host_module("04").Host
REQS = [req(f"r{i:02d}", 6, 100 + i, 2) for i in range(40)]


def check(cls):
    h = make(cls)
    stamps = {}
    for r in REQS:
        h.submit(r)
        stamps[r.request_id] = time.monotonic()  # submit has returned: the request was accepted before this
    time.sleep(0.05)
    outs = drain(h)
    late = sorted((o.request_id, round(o.arrival_time - stamps[o.request_id], 4)) for o in outs
                  if o.arrival_time > stamps[o.request_id])
    return (len(outs) == 40 and not late,
            f"40 requests submitted (32 slots), 0.05 s before the first step; outputs {len(outs)}; arrival_time later "
            f"than submit() returned (id, seconds later): {late[:3]}{' ...' if len(late) > 3 else ''} "
            f"({len(late)} of 40)")


run("p04", check, H)
