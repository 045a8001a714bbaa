"""h12: each record's decode count and KV tokens match the batch that ran (also in the step a request finishes)."""
import sys
import _common as c


def check(cls):
    h = c.make(cls)
    ic, sink, recs = c.install(h)
    h.submit(c.ClientRequest("short", c.prompt(6, 1), 2))
    h.submit(c.ClientRequest("long", c.prompt(6, 2), 5))
    c.drain(h)
    batches = {b.step_id: b for b in ic.batches}
    for r in recs:
        b = batches[r.step_id]
        if (r.num_decode, r.kv_tokens, r.prefill_lengths) != (b.num_decode, b.kv_tokens, b.prefill_lengths):
            return False, (f"step {r.step_id}: record decode={r.num_decode} kv={r.kv_tokens}, batch ran "
                           f"decode={b.num_decode} kv={b.kv_tokens}")
    return True, f"{len(recs)} records match"


sys.exit(c.verdict(check, "12"))
