"""p14: run_idle_step() is True for a fine-tuning-only step that ran and was aborted (its record reached the sink)."""
from _common import *  # noqa: F403


def check(cls):
    h = make(cls)
    ic, sk, rec = install(h, plan=lambda b, i: [sample(1, 12)] if i == 0 else [], abort=lambda s, i: i >= 1)
    h.set_finetune_adapter(ft_state(seed=FT_ADAPTER_SEED))
    ran = h.run_idle_step()
    recs = [(r.step_id, r.finetune_sample_ids, r.aborted_sample_ids) for r in rec.records]
    ok = ran is True and len(rec.records) == 1
    return ok, (f"FT-only idle step, abort answered True before layer 1: records at the sink (step, completed, "
                f"aborted) {recs}; run_idle_step() -> {ran}")


run("p14", check, host_module("14").Host)
