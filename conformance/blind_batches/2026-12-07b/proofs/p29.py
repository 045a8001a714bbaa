"""p29: after set_finetune_adapter(state named 'job'), client adapter 'job' still serves its own folder (PEFT)."""
from _common import *  # noqa: F401,F403

H = host_module("29").Host
CLIENT = adapter_dir("cl", seed=3)


def check(cls):
    h = make(cls, client_adapters={"job": str(CLIENT)})
    h.set_finetune_adapter(ft_state(seed=FT_ADAPTER_SEED))  # LoraAdapterState name "job"
    p = prompt(12, 181)
    got = list(h.generate([ClientRequest("a", p, 8, adapter="job")])[0].token_ids)
    truth = hf_greedy(p, 8, CLIENT)
    return got == truth, f"client adapter 'job' (seed 3); set_finetune_adapter(name 'job', seed 7); request on 'job': " \
                         f"truth (PEFT seed 3) {truth}; got {got}"


run("p29", check, H)
