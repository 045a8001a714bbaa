"""p12: a sample injected into a decode-only step runs in that step on a mixed-batch host (h12: refused)."""
from _common import *  # noqa: F403

S = sample(1, 10)


def check(cls):
    h = make(cls)
    assert h.capabilities().mixed_batches
    ic, sk, rec = install(h, plan=lambda b, i: [S] if i == 2 else [])
    h.set_finetune_adapter(ft_state(seed=FT_ADAPTER_SEED))
    h.submit(req("a", 8, 4, 6))
    drain(h)
    b2 = ic.batches[2]
    r2 = steps_by_id(rec.records)[b2.step_id]
    ok = r2.finetune_sample_ids == (1,) and not r2.aborted_sample_ids
    return ok, (f"mixed_batches=True; step 2 offered {b2.num_decode} decode(s), no prefill, sample 1 injected: record "
                f"finetune_sample_ids {r2.finetune_sample_ids}, aborted_sample_ids {r2.aborted_sample_ids}")


run("p12", check, host_module("12").Host)
