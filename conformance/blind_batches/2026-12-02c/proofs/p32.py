"""p32: an aborted fine-tuning-only step is reported: one record, its samples in aborted_sample_ids."""
from _common import *  # noqa: F403


def check(cls):
    h = make(cls)
    h.set_finetune_adapter(ft_state())
    s = sample(0, 10)
    ic, sk, rec = install(h, plan=lambda b, i: [s] if i == 0 else (), abort=lambda st, k: k >= 1)
    h.run_idle_step()
    got = [(r.step_id, r.aborted_sample_ids) for r in rec.records]
    return len(got) == 1 and got[0][1] == (0,), f"records {got}"


run("p32", check, host_module("32").Host)
