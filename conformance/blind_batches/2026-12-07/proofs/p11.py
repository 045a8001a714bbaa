"""p11: every submitted, unfinished request must be in the proposed batch's scheduled or waiting."""
from _common import *  # noqa: F403

Host = host_module("11").Host
REQS = [req(f"r{i}", 600, 110 + i, 2) for i in range(4)]


def check(cls):
    h = make(cls)
    ic, sk, rec = install(h)
    for r in REQS:
        h.submit(r)
    h.step()
    b = ic.batches[0]
    sched, wait = ids_of(b.scheduled), ids_of(b.waiting)
    missing = [r.request_id for r in REQS if r.request_id not in sched + wait]
    return not missing, (f"4 prompts of 600 tokens, max_batch_tokens 2048; step 0 scheduled {sched}, waiting {wait}, "
                         f"in neither {missing}")


run("p11", check, Host)
