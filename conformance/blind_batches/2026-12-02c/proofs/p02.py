"""p02: two fine-tuning samples in one step: each one's captures equal its own PEFT forward."""
from _common import *  # noqa: F403


def check(cls):
    h = make(cls)
    h.set_finetune_adapter(ft_state())
    s0, s1 = sample(0, 10), sample(1, 14)
    ic, sk, rec = install(h, plan=lambda b, i: [s0, s1] if i == 0 else ())
    h.run_idle_step()
    bad = capture_problems(h, sk, [s0, s1])
    return not bad, "captures match PEFT" if not bad else "; ".join(bad)


run("p02", check, host_module("02").Host)
