"""p27: the record of a step carries the step id the step was proposed under; the record listing a fine-tuning
sample has the id of the step that admitted it and of its captures."""
from _common import ClientRequest, ft_state, host_module, install, make, prompt, run, sample

S = sample(1, 8)


def check(cls):
    h = make(cls)
    ic, sk, rec = install(h, plan=lambda b, i: [S] if i == 1 else [])
    h.set_finetune_adapter(ft_state())
    h.generate([ClientRequest("r", prompt(6, 8), 4)])
    proposed = [b.step_id for b in ic.batches]
    got = [r.step_id for r in rec.records]
    admitted = ic.batches[1].step_id
    with_ft = [r.step_id for r in rec.records if S.sample_id in r.finetune_sample_ids]
    captured = sorted({e[1] for e in sk.layers()})
    ok = got == proposed and with_ft == [admitted] and captured == [admitted]
    return ok, (f"proposed {proposed}, records {got}; sample admitted in step {admitted}, captured in {captured}, "
                f"reported in {with_ft}")


run("p27", check, host_module("27").Host)
