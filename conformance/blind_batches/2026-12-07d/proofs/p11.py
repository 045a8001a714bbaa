"""p11: a fine-tuning-only step aborted at its first boundary, then a client request: every StepRecord has its own
step_id, increasing (no id reused)."""
from _common import *

s = sample(1, 9)


def check(cls):
    h = make(cls)
    ic, sk, rec = install(h, plan=lambda b, i: [s] if i == 0 else [], abort=lambda st, i: i == 0)
    h.set_finetune_adapter(ft_state(seed=FT_ADAPTER_SEED))
    ran = h.run_idle_step()
    h.generate([ClientRequest("a", prompt(12, 5), 3)])
    ids = [r.step_id for r in rec.records]
    aborted = [r.aborted_sample_ids for r in rec.records[:1]]
    ok = ids == sorted(set(ids)) and len(ids) == 4
    return ok, f"aborted step {aborted} (ran={ran}) then 3 client steps; record step ids {ids}"


run("p11", check, host_module("11").Host)
