"""p12: two fine-tuning-only steps (sample 1, then sample 2): each end_step names as completed exactly the samples
of its own step."""
from _common import *

s1, s2 = sample(1, 9), sample(2, 11)


def check(cls):
    h = make(cls)
    plan = {0: [s1], 1: [s2]}
    ic, sk, rec = install(h, plan=lambda b, i: plan.get(i, []))
    h.set_finetune_adapter(ft_state(seed=FT_ADAPTER_SEED))
    h.run_idle_step()
    h.run_idle_step()
    ends = [(e[1], e[2], e[3]) for e in sk.events if e[0] == "end"]
    want = [(r.step_id, r.finetune_sample_ids, ()) for r in rec.records]
    ok = [e[1:] for e in ends] == [((1,), ()), ((2,), ())]
    return ok, f"end_step (step, completed, aborted): {ends}; records {want}"


run("p12", check, host_module("12").Host)
