"""p19: a fine-tuning adapter of rank 8 on a host with max_lora_rank=4 is refused by raising."""
from _common import *  # noqa: F403


def check(cls):
    h = make(cls, max_lora_rank=4)
    try:
        h.set_finetune_adapter(ft_state(r=8))
    except Exception as e:  # noqa: BLE001
        return True, f"refused: {type(e).__name__}"
    return False, "accepted a rank-8 adapter with max_lora_rank=4 (runs with part of it)"


run("p19", check, host_module("19").Host)
