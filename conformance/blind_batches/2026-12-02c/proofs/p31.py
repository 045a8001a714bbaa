"""p31: a base-model client whose prompt starts like a fine-tuning sample that ran before gets base greedy tokens."""
from _common import *  # noqa: F403


def check(cls):
    h = make(cls)
    h.set_finetune_adapter(ft_state())
    s = sample(0, 40)
    ic, sk, rec = install(h, plan=lambda b, i: [s] if i == 0 else ())
    h.run_idle_step()  # the sample runs alone
    p = tuple(s.input_ids[:20]) + prompt(4, 5)  # same 20-token "template" as the training sample
    out = h.generate([ClientRequest("a", p, 4)])[0]
    truth = hf_greedy(p, 4)
    return list(out.token_ids) == truth, f"got {list(out.token_ids)}, base greedy truth {truth}"


run("p31", check, host_module("31").Host)
