"""p13: finished requests listed in the next step's scheduled. Truth: arithmetic over submitted and returned requests."""
from _common import *


def check(cls):
    h = make(cls)
    ic, sk, rec = install(h)
    reqs = [req("a", 8, 131, 2), req("b", 10, 132, 6)]
    for r in reqs:
        h.submit(r)
    returned, bad = set(), []
    for _ in range(20):
        if not h.has_unfinished():
            break
        unfinished = {r.request_id for r in reqs} - returned
        n = len(ic.batches)
        outs = h.step()
        for b in batches_of(ic, n):
            extra = sorted({v.request_id for v in b.scheduled} - unfinished)
            if extra:
                bad.append((b.step_id, extra))
        returned |= {o.request_id for o in outs}
    return not bad and returned == {"a", "b"}, f"a (2 tokens), b (6 tokens); (step, finished requests in scheduled): {bad}"


run("p13", check, host_module("13").Host)
