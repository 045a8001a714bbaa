"""p16: after an aborted fine-tuning-only step, the next one must be asked should_abort and (answered False) run."""
from _common import *  # noqa: F403

Host = host_module("16").Host
S1, S2 = sample(1, 10), sample(2, 10)


def check(cls):
    h = make(cls)
    ic, sk, rec = install(h, plan=lambda b, i: [S1] if i == 0 else [S2] if i == 1 else [],
                          abort=lambda s, i: i == 1)  # True only at the second question (before layer 1 of step 0)
    h.set_finetune_adapter(ft_state(seed=FT_ADAPTER_SEED))
    h.run_idle_step()
    h.run_idle_step()
    recs = [(r.step_id, r.finetune_sample_ids, r.aborted_sample_ids) for r in rec.records]
    asked = [e[1] for e in sk.events if e[0] == "abort?"]
    s1 = rec.records[1].step_id if len(rec.records) > 1 else None
    ok = len(rec.records) == 2 and rec.records[1].finetune_sample_ids == (2,) and asked.count(s1) == 2
    return ok, f"records (step, completed, aborted) {recs}; should_abort asked for steps {asked}"


run("p16", check, Host)
