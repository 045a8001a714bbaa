"""p21: set_finetune_adapter leaves the caller's state as it was handed over (hooks.py, set_finetune_adapter:
"The host must copy what it keeps: once the call returns, state is the caller's")."""
import _common as c
import torch


def check(cls):
    state = c.ft_state(seed=c.FT_ADAPTER_SEED)
    before = {k: v.clone() for k, v in state.tensors.items()}
    h = c.make(cls)
    h.set_finetune_adapter(state)
    changed = [k for k, v in state.tensors.items() if not torch.equal(v, before[k])]
    ratio = None
    if changed:
        k = changed[0]
        ratio = float((state.tensors[k].abs().sum() / before[k].abs().sum()))
    return not changed, (f"{len(changed)} of {len(before)} caller tensors changed by the call"
                         + (f" (e.g. {changed[0].split('model.')[-1]} scaled x{ratio:.3g}; alpha/r = "
                            f"{state.config.scaling})" if changed else ""))


c.run("p21", check, c.host_module("21").Host)
