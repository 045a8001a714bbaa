"""h06: an abort that turns true at the second layer boundary stops the fine-tuning-only step there."""
import sys
import _common as c


def check(cls):
    h = c.make(cls)
    s = c.sample(7, 10)
    ic, sink, recs = c.install(h, plan=[(s,)], abort=lambda step, n: n >= 2)
    assert h.capabilities().supports_abort
    h.run_idle_step()
    r = recs[-1]
    if r.aborted_sample_ids != (s.sample_id,) or r.finetune_sample_ids:
        return False, f"abort at layer 1 ignored: record finetune={r.finetune_sample_ids} aborted={r.aborted_sample_ids}, polls={sink.abort_calls}"
    return True, f"aborted after {sink.abort_calls} polls"


sys.exit(c.verdict(check, "06"))
