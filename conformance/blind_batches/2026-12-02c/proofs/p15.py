"""p15: a client request whose id equals an injected sample's id still gets all its greedy tokens (HF truth)."""
from _common import *  # noqa: F403


def check(cls):
    h = make(cls)
    h.set_finetune_adapter(ft_state())
    s = sample(0, 10)
    ic, sk, rec = install(h, plan=lambda b, i: [s] if i == 1 else ())
    p = prompt(8, 1)
    out = h.generate([ClientRequest("0", p, 5)])[0]
    truth = hf_greedy(p, 5)
    return list(out.token_ids) == truth, f"client '0' got {list(out.token_ids)}, greedy truth {truth}"


run("p15", check, host_module("15").Host)
