"""p04: layer_input(layer i) is the input of layer i (layer 0: the embedding), per PEFT's hidden_states."""
from _common import *  # noqa: F403


def check(cls):
    h = make(cls)
    h.set_finetune_adapter(ft_state())
    s = sample(0, 12)
    ic, sk, rec = install(h, plan=lambda b, i: [s] if i == 0 else ())
    h.run_idle_step()
    bad = capture_problems(h, sk, [s])
    return not bad, "captures match PEFT" if not bad else "; ".join(bad)


run("p04", check, host_module("04").Host)
