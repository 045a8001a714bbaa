"""p13: a sample riding a step with a client prefill must be captured as PEFT computes it alone."""
from _common import *  # noqa: F403

Host = host_module("13").Host
S = sample(1, 10)


def check(cls):
    h = make(cls)
    ic, sk, rec = install(h, plan=lambda b, i: [S] if i == 0 else [])
    h.set_finetune_adapter(ft_state(seed=FT_ADAPTER_SEED))
    h.submit(req("c", 12, 131, 3))
    h.step()
    r0 = rec.records[0]
    bad = capture_problems(h, sk, [S])
    return not bad, (f"step 0: client prompt 12 + sample 1 (10 tokens), record prefill {r0.prefill_lengths} ft "
                     f"{r0.finetune_sample_ids}; captures vs PEFT: {bad or 'exact'}")


run("p13", check, Host)
