"""p08: rank == max_lora_rank refused. Truth: arithmetic (16 <= max_lora_rank 16) and PEFT layer inputs."""
from _common import *

S = [sample(1, 10)]
R16 = adapter_dir("ft", seed=9, r=16)


def check(cls):
    h = make(cls)  # max_lora_rank 16 (HostConfig default)
    ic, sk, rec = install(h, plan=lambda b, i: S if i == 0 else [])
    try:
        h.set_finetune_adapter(ft_state(seed=9, r=16))
    except Exception as e:  # noqa: BLE001
        return False, f"max_lora_rank {h.config.max_lora_rank}, state of rank 16 refused: {type(e).__name__}: {e}"
    ran = h.run_idle_step()
    bad = capture_problems(h, sk, S, adapter=R16)
    return ran and not bad, f"max_lora_rank {h.config.max_lora_rank}, state of rank 16 loaded; captures vs PEFT: {bad}"


run("p08", check, host_module("08").Host)
