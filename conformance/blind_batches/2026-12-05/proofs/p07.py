"""p07: every unfinished request is in scheduled or waiting of each ProposedBatch (types.py, ProposedBatch)."""
import _common as c


def check(cls):
    h = c.make(cls)
    ic, sk, rec = c.install(h)
    submitted = [f"r{k}" for k in range(40)]
    for k, rid in enumerate(submitted):
        h.submit(c.req(rid, 3, 200 + k, 2))
    finished, bad = set(), []
    while h.has_unfinished():
        n = len(ic.batches)
        outs = h.step()
        for b in ic.batches[n:]:
            sched = {r.request_id for r in b.scheduled}
            wait = {r.request_id for r in b.waiting}
            missing = set(submitted) - finished - sched - wait
            if missing or sched & wait:
                bad.append(f"step {b.step_id}: {len(missing)} unfinished requests in neither list "
                           f"(scheduled {len(sched)}, waiting {len(wait)})")
        finished |= {o.request_id for o in outs}
    return not bad and finished == set(submitted), (f"40 requests, {len(ic.batches)} steps; " + ("; ".join(bad) or "every unfinished request offered"))


c.run("p07", check, c.host_module("07").Host)
