"""p20: a client prefill sharing its step with fine-tuning rows gets the greedy tokens of the model (HF truth)."""
from _common import *  # noqa: F403


def check(cls):
    h = make(cls)
    h.set_finetune_adapter(ft_state())
    s = sample(0, 12)
    ic, sk, rec = install(h, plan=lambda b, i: [s] if i == 0 else ())
    p = prompt(8, 1)
    out = h.generate([ClientRequest("a", p, 3)])[0]
    truth = hf_greedy(p, 3)
    return list(out.token_ids) == truth, f"got {list(out.token_ids)}, greedy truth {truth}"


run("p20", check, host_module("20").Host)
