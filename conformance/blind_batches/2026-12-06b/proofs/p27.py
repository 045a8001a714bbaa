"""p27: after an aborted FT-only step, the next step carries only the samples on_schedule returned for it."""
from _common import *  # noqa: F403


def check(cls):
    h = make(cls)
    ic, sk, rec = install(h, plan=lambda b, i: [sample(1, 12)] if i == 0 else [], abort=lambda s, i: i >= 1)
    h.set_finetune_adapter(ft_state(seed=FT_ADAPTER_SEED))
    ran = h.run_idle_step()
    h.submit(req("a", 8, 1, 3))
    drain(h)
    rs = steps_by_id(rec.records)
    admitted = {b.step_id: () for b in ic.batches}
    admitted[ic.batches[0].step_id] = (1,)
    wrong = [(sid, r.finetune_sample_ids + r.aborted_sample_ids, admitted.get(sid)) for sid, r in rs.items()
             if r.finetune_sample_ids + r.aborted_sample_ids != admitted.get(sid)]
    return not wrong, (f"step 0: sample 1 admitted, aborted before layer 1 (ran={ran}, record aborted "
                       f"{rs[ic.batches[0].step_id].aborted_sample_ids}); then a 3-token request; steps carrying "
                       f"samples not admitted to them (step, ran, admitted): {wrong}")


run("p27", check, host_module("27").Host)
