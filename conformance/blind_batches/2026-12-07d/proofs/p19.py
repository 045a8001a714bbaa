"""p19: set_finetune_adapter(version 5, seed 7) then set_finetune_adapter(version 1, seed 9): a fine-tuning-only step
captures the PEFT model's layer inputs with the seed-9 adapter."""
from _common import *

s = sample(1, 10)


def check(cls):
    h = make(cls)
    ic, sk, rec = install(h, plan=lambda b, i: [s] if i == 0 else [])
    h.set_finetune_adapter(ft_state(seed=7, version=5))
    h.set_finetune_adapter(ft_state(seed=9, version=1))
    ran = h.run_idle_step()
    bad = capture_problems(h, sk, [s], adapter=adapter_dir("ft", seed=9))
    return ran and not bad, f"v5 (seed 7) then v1 (seed 9); captures vs PEFT seed 9: {bad}"


run("p19", check, host_module("19").Host)
