"""p14: the activation sink's step_id is the step's id (the batch offered to on_schedule, the record)."""
from _common import *  # noqa: F403


def check(cls):
    h = make(cls)
    h.set_finetune_adapter(ft_state())
    s = sample(0, 10)
    ic, sk, rec = install(h, plan=lambda b, i: [s] if i == 1 else ())
    h.run_idle_step()  # the core declines: nothing executes
    h.generate([ClientRequest("a", prompt(8, 1), 2)])
    want = next(b.step_id for b, i in zip(ic.batches, range(99)) if i == 1)
    rec_id = [r.step_id for r in rec.records if r.finetune_sample_ids]
    got = sorted({e[1] for e in sk.events})
    ok = got == [want] and rec_id == [want]
    return ok, f"batch step {want}, record step {rec_id}, sink step ids {got}"


run("p14", check, host_module("14").Host)
