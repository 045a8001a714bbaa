"""p33: the batch offered to on_schedule is the one that ran: its composition equals the step record's."""
from _common import *  # noqa: F403


def check(cls):
    h = make(cls)
    ic, sk, rec = install(h)
    h.submit(ClientRequest("a", prompt(8, 1), 4))
    h.step()
    h.submit(ClientRequest("b", prompt(6, 2), 2))  # admitted while "a" decodes
    while h.has_unfinished():
        h.step()
    by_id = {r.step_id: r for r in rec.records}
    bad = [f"step {b.step_id}: offered prefills {b.prefill_lengths} + {b.num_decode} decodes, ran "
           f"{by_id[b.step_id].prefill_lengths} + {by_id[b.step_id].num_decode}"
           for b in ic.batches if b.step_id in by_id and
           (tuple(sorted(b.prefill_lengths)) != tuple(sorted(by_id[b.step_id].prefill_lengths))
            or b.num_decode != by_id[b.step_id].num_decode)]
    return not bad, "offered == ran" if not bad else "; ".join(bad)


run("p33", check, host_module("33").Host)
