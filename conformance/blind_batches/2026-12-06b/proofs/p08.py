"""p08: a fine-tuning sample riding a client prefill step is captured as PEFT's layer inputs (h08: stale offsets)."""
from _common import *  # noqa: F403

S = sample(1, 10)


def check(cls):
    h = make(cls)
    ic, sk, rec = install(h, plan=lambda b, i: [S] if i == 0 else [])
    h.set_finetune_adapter(ft_state(seed=FT_ADAPTER_SEED))
    h.submit(req("a", 12, 5, 3))
    drain(h)
    bad = capture_problems(h, sk, [S])
    r0 = steps_by_id(rec.records)[ic.batches[0].step_id]
    return not bad, (f"step 0: client prompt 12 + sample 1 (10 tokens), record prefill {r0.prefill_lengths} ft "
                     f"{r0.finetune_sample_ids}; captures vs PEFT: {bad[:4]}{' ...' if len(bad) > 4 else ''}")


run("p08", check, host_module("08").Host)
