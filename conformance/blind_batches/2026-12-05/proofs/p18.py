"""p18: the record's composition is what ran: client prefills in prefill_lengths, fine-tuning rows in
finetune_lengths (hooks.py, report_step_time; types.py, StepRecord)."""
import _common as c


def check(cls):
    s1 = c.sample(1, 12)
    h = c.make(cls)
    ic, sk, rec = c.install(h, plan=lambda b, i: [s1] if i == 0 else [])
    h.set_finetune_adapter(c.ft_state(seed=c.FT_ADAPTER_SEED))
    h.submit(c.req("r", 8, 13, 2))
    c.drain(h)
    r0 = rec.records[0]
    ok = r0.prefill_lengths == (8,) and r0.finetune_lengths == (12,) and r0.finetune_sample_ids == (1,)
    return ok, (f"step 0 ran prompt of 8 + sample of 12: record prefill_lengths {r0.prefill_lengths}, "
                f"finetune_lengths {r0.finetune_lengths} (truth (8,), (12,))")


c.run("p18", check, c.host_module("18").Host)
