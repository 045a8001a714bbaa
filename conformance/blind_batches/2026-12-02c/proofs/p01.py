"""p01: captures of a fine-tuning row placed after client rows equal the PEFT forward of the sample alone."""
from _common import *  # noqa: F403


def check(cls):
    h = make(cls)
    h.set_finetune_adapter(ft_state())
    s = sample(0, 12)
    ic, sk, rec = install(h, plan=lambda b, i: [s] if i == 0 else ())
    h.generate([ClientRequest("a", prompt(8, 1), 2)])
    bad = capture_problems(h, sk, [s])
    return not bad, "captures match PEFT" if not bad else "; ".join(bad)


run("p01", check, host_module("01").Host)
