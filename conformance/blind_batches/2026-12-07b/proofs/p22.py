"""p22: after set_finetune_adapter(q/v adapter) replaces a q/k/v/o one, rows run exactly the q/v adapter."""
from _common import *  # noqa: F401,F403
from _common import CACHE  # noqa: F401

from deltaserve_core.adapter_state import LoraAdapterState  # noqa: E402

H = host_module("22").Host
QV = adapter_dir("ftqv", seed=9, targets=("q_proj", "v_proj"))


def check(cls):
    h = make(cls)
    samples = [sample(1, 12)]
    ic, sk, rec = install(h, plan=lambda b, i: list(samples) if i == 0 else [])
    h.set_finetune_adapter(ft_state(seed=FT_ADAPTER_SEED))  # job 1: q, k, v, o
    h.set_finetune_adapter(LoraAdapterState.load_pretrained(QV, name="job2"))  # job 2: q, v
    ran = h.run_idle_step()
    bad = capture_problems(h, sk, samples, adapter=QV)
    return not bad and ran, f"set (q,k,v,o seed 7) then (q,v seed 9); sample 1 (ran={ran}); captures vs PEFT q/v: {bad}"


run("p22", check, H)
