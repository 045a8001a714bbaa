"""p07: no request in both scheduled and waiting."""
from _common import *  # noqa: F401,F403

H = host_module("07").Host


def check(cls):
    h = make(cls)
    ic, sk, rec = install(h)
    for i in range(3):
        h.submit(req(f"r{i}", 8, 10 + i, 3))
    outs = drain(h)
    bad = []
    for b in ic.batches:
        both = {s.request_id for s in b.scheduled} & {w.request_id for w in b.waiting}
        if both:
            bad.append((b.step_id, sorted(both)))
    return (not bad and len(outs) == 3,
            f"3 requests, {len(ic.batches)} steps; requests in scheduled AND waiting: {bad or 'none'}")


run("p07", check, H)
