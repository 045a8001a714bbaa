"""p19: a fine-tuning row in a step with a base-model client request is computed with the fine-tuning adapter
(captures equal the PEFT model's layer inputs)."""
from _common import ClientRequest, capture_problems, ft_state, host_module, install, make, prompt, run, sample

S = sample(1, 10)


def check(cls):
    h = make(cls)
    ic, sk, rec = install(h, plan=lambda b, i: [S] if i == 0 else [])
    h.set_finetune_adapter(ft_state())
    h.generate([ClientRequest("r", prompt(6, 5), 3)])
    bad = capture_problems(h, sk, [S])
    ran = any(S.sample_id in r.finetune_sample_ids for r in rec.records)
    return not bad and ran, "captures match PEFT" if not bad else "; ".join(bad)


run("p19", check, host_module("19").Host)
