"""p14: inbox drained after the proposal. Truth: arithmetic over submitted and returned requests."""
from _common import *


def check(cls):
    h = make(cls)
    ic, sk, rec = install(h)
    a, b = req("a", 10, 141, 6), req("b", 9, 142, 3)
    h.submit(a)
    returned, bad, submitted = set(), [], {"a"}
    for i in range(20):
        if i == 1:
            h.submit(b)  # b arrives while a decodes
            submitted.add("b")
        if not h.has_unfinished():
            break
        pending = submitted - returned
        n = len(ic.batches)
        outs = h.step()
        for bt in batches_of(ic, n):
            seen = {v.request_id for v in bt.scheduled} | {v.request_id for v in bt.waiting}
            if pending - seen:
                bad.append((bt.step_id, sorted(pending - seen)))
        returned |= {o.request_id for o in outs}
    return not bad and returned == {"a", "b"}, f"a running, b submitted before step 1; (step, pending requests in neither list): {bad}"


run("p14", check, host_module("14").Host)
