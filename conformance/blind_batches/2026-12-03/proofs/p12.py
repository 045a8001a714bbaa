"""p12: begin_step / end_step are called once for each step that carried fine-tuning rows and for no other step
(the steps with fine-tuning rows are those whose record lists them)."""
from _common import ClientRequest, ft_state, host_module, install, make, prompt, run, sample

S = sample(1, 8)


def check(cls):
    h = make(cls)
    ic, sk, rec = install(h, plan=lambda b, i: [S] if i == 2 else [])
    h.set_finetune_adapter(ft_state())
    h.generate([ClientRequest("r", prompt(6, 3), 5)])
    ft_steps = [r.step_id for r in rec.records if r.finetune_sample_ids or r.aborted_sample_ids]
    begins = [e[1] for e in sk.events if e[0] == "begin"]
    ends = [e[1] for e in sk.events if e[0] == "end"]
    ok = begins == ft_steps and ends == ft_steps and len(ft_steps) == 1
    return ok, f"steps with fine-tuning rows {ft_steps}; begin_step for {begins}; end_step for {ends}"


run("p12", check, host_module("12").Host)
