"""p30: a 48-token sample: one layer_input per layer, shape [48, hidden], equal to PEFT's layer inputs."""
from _common import *  # noqa: F403


def check(cls):
    h = make(cls)
    h.set_finetune_adapter(ft_state())
    s = sample(0, 48)
    ic, sk, rec = install(h, plan=lambda b, i: [s] if i == 0 else ())
    h.run_idle_step()
    bad = capture_problems(h, sk, [s])
    return not bad, "one full capture per layer" if not bad else "; ".join(bad[:3])


run("p30", check, host_module("30").Host)
