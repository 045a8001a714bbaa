"""p01: set_finetune_adapter must copy what it keeps (the core changes its tensors in place afterwards)."""
import torch
from _common import *  # noqa: F403

H = host_module("01").Host
SAMPLES = [sample(1, 10), sample(2, 7)]


def check(cls):
    h = make(cls)
    ic, sk, rec = install(h, plan=lambda b, i: SAMPLES if i == 0 else [])
    st = ft_state(seed=FT_ADAPTER_SEED)
    h.set_finetune_adapter(st)
    with torch.no_grad():  # the core's optimizer step, in place, after the call returned
        for t in st.tensors.values():
            t.mul_(-3.0)
    ran = h.run_idle_step()
    bad = capture_problems(h, sk, SAMPLES)  # truth: PEFT with the weights as installed (seed 7 folder)
    return ran and not bad, f"idle step ran={ran}; captures vs PEFT on the installed weights: {bad[:3] or 'all match'}"


run("p01", check, H)
