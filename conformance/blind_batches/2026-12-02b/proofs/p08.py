"""h08: a fine-tuning row sharing a step with a client prompt completes even if the sink wants an abort."""
import sys
import _common as c


def check(cls):
    h = c.make(cls)
    s = c.sample(9, 10)
    ic, sink, recs = c.install(h, plan=[(s,)], abort=lambda step, n: True)
    h.submit(c.ClientRequest("r0", c.prompt(7), 2))
    h.step()
    r = recs[-1]
    if r.finetune_sample_ids != (s.sample_id,) or r.aborted_sample_ids:
        return False, f"mixed step: finetune={r.finetune_sample_ids} aborted={r.aborted_sample_ids}"
    return c.check_captures(sink, [s])


sys.exit(c.verdict(check, "08"))
