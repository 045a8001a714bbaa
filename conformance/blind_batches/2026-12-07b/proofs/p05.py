"""p05: every ProposedBatch offered while request a is unfinished lists it (scheduled or waiting)."""
from _common import *  # noqa: F401,F403
from _common import CACHE  # noqa: F401

H = host_module("05").Host


def check(cls):
    h = make(cls)
    ic, sk, rec = install(h, plan=lambda b, i: [sample(1, 10)] if not b.scheduled else [])
    h.set_finetune_adapter(ft_state(seed=FT_ADAPTER_SEED))
    h.submit(req("a", 10, 3, 3))
    ran = h.run_idle_step()
    outs = drain(h)
    seen = []
    for b in ic.batches:
        ids = {r.request_id for r in b.scheduled} | {r.request_id for r in b.waiting}
        seen.append((b.step_id, "a" in ids))
    ok = all(x for _, x in seen) and ids_of(outs) == ["a"]
    return ok, f"submit a, run_idle_step() -> {ran}; batches (step, lists a): {seen}; outputs {ids_of(outs)}"


run("p05", check, H)
