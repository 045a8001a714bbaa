"""h27: set_finetune_adapter leaves the caller's tensors unchanged."""
import sys
import torch
import _common as c


def check(cls):
    h = c.make(cls)
    state = c.lora_state(seed=5)
    before = {k: v.clone() for k, v in state.tensors.items()}
    h.set_finetune_adapter(state)
    changed = [k for k in before if not torch.equal(before[k], state.tensors[k])]
    return (not changed), f"{len(changed)} caller tensors changed"


sys.exit(c.verdict(check, "27"))
