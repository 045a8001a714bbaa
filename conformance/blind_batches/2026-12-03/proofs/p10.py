"""p10: in every ProposedBatch, ``waiting`` holds exactly the submitted, unfinished requests not in ``scheduled``
(plain bookkeeping over the submitted requests and the outputs returned)."""
from _common import ClientRequest, host_module, install, make, prompt, run


def check(cls):
    h = make(cls)
    ic, sk, rec = install(h)
    live, bad = set(), []

    def step():
        before = len(ic.batches)
        outs = h.step()
        for b in ic.batches[before:]:
            s = {q.request_id for q in b.scheduled}
            w = [q.request_id for q in b.waiting]
            if s & set(w) or set(w) != live - s or len(w) != len(set(w)):
                bad.append(f"step {b.step_id}: scheduled {sorted(s)} waiting {w} (unfinished {sorted(live)})")
        live.difference_update(o.request_id for o in outs)

    h.submit(ClientRequest("a", prompt(6, 1), 6)); live.add("a")
    step(); step()
    h.submit(ClientRequest("b", prompt(6, 2), 4)); live.add("b")
    while h.has_unfinished():
        step()
    return not bad, f"{len(ic.batches)} batches consistent" if not bad else "; ".join(bad[:3])


run("p10", check, host_module("10").Host)
