"""h13: a step with a client prompt and a fine-tuning row reports them apart."""
import sys
import _common as c


def check(cls):
    h = c.make(cls)
    s = c.sample(14, 11)
    ic, sink, recs = c.install(h, plan=[(s,)])
    h.submit(c.ClientRequest("r0", c.prompt(7), 2))
    h.step()
    r, b = recs[0], ic.batches[0]
    if r.prefill_lengths != b.prefill_lengths or r.finetune_lengths != (11,):
        return False, f"record prefill={r.prefill_lengths} ft={r.finetune_lengths}; ran prefill={b.prefill_lengths} ft=(11,)"
    return True, "composition right"


sys.exit(c.verdict(check, "13"))
