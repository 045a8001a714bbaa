"""p07: fine-tuning rows (reserved adapter on q/k/v/o) in a step with a client request on an adapter of q/v only: the
captures equal the PEFT model's with the fine-tuning adapter; the client's tokens equal PEFT greedy with its adapter."""
from _common import *

qv = adapter_dir("qv", seed=3, targets=("q_proj", "v_proj"))
s = sample(1, 10)
p = prompt(12, 5)
truth = hf_greedy(p, 3, adapter=qv)


def check(cls):
    h = make(cls, client_adapters={"qv": str(qv)})
    ic, sk, rec = install(h, plan=lambda b, i: [s] if i == 0 else [])
    h.set_finetune_adapter(ft_state(seed=FT_ADAPTER_SEED))
    got = list(h.generate([ClientRequest("a", p, 3, adapter="qv")])[0].token_ids)
    bad = capture_problems(h, sk, [s])
    ran = any(r.finetune_sample_ids == (1,) for r in rec.records)
    return ran and not bad and got == truth, (f"client 'qv' (q/v) + sample 1 (q/k/v/o) in step 0 (ran={ran}); "
                                              f"captures vs PEFT: {bad}; client tokens {got} truth {truth}")


run("p07", check, host_module("07").Host)
