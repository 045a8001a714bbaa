"""p07: reserved slot keeps its first scaling. Truth: PEFT layer inputs with the second state's adapter."""
from _common import *

S = [sample(1, 12)]
SECOND = adapter_dir("ft", seed=9, r=16)  # r 16, lora_alpha 16: scaling 1 (the first state: r 8, alpha 16, scaling 2)


def check(cls):
    h = make(cls)
    ic, sk, rec = install(h, plan=lambda b, i: S if i == 0 else [])
    h.set_finetune_adapter(ft_state(seed=7, r=8))
    h.set_finetune_adapter(ft_state(seed=9, r=16))
    ran = h.run_idle_step()
    bad = capture_problems(h, sk, S, adapter=SECOND)
    return ran and not bad, f"set (r 8 / alpha 16) then (r 16 / alpha 16); sample 1 (ran={ran}); captures vs PEFT r 16: {bad}"


run("p07", check, host_module("07").Host)
