"""h07: an aborted sample is reported in aborted_sample_ids only, not as completed."""
import sys
import _common as c


def check(cls):
    h = c.make(cls)
    s = c.sample(8, 10)
    ic, sink, recs = c.install(h, plan=[(s,)], abort=lambda step, n: True)
    h.run_idle_step()
    r = recs[-1]
    if r.aborted_sample_ids != (s.sample_id,) or r.finetune_sample_ids or r.finetune_lengths:
        return False, f"record finetune={r.finetune_sample_ids}/{r.finetune_lengths} aborted={r.aborted_sample_ids}"
    return True, "aborted only"


sys.exit(c.verdict(check, "07"))
