"""p21: with two hosts in one process, each one's fine-tuning rows use its own set_finetune_adapter weights."""
from _common import *  # noqa: F403

S = sample(1, 10)


def check(cls):
    a, b = make(cls), make(cls)
    ic, sk, rec = install(a, plan=lambda bt, i: [S] if i == 0 else [])
    a.set_finetune_adapter(ft_state(seed=FT_ADAPTER_SEED))
    b.set_finetune_adapter(ft_state(seed=8))
    ran = a.run_idle_step()
    bad = capture_problems(a, sk, [S])
    return not bad, (f"host A set adapter seed 7, host B seed 8; A's FT-only step ran={ran}; A's captures vs PEFT "
                     f"(seed 7): {bad[:3]}")


run("p21", check, host_module("21").Host)
