"""h14: records arrive one per step, in step order; a fine-tuning-only step's record is in when run_idle_step returns."""
import sys
import _common as c


def check(cls):
    h = c.make(cls)
    ic, sink, recs = c.install(h, plan=[(c.sample(15, 9),)])
    assert h.run_idle_step()
    n_after_idle = len(recs)
    h.generate([c.ClientRequest("r0", c.prompt(5), 2)])
    ids = [r.step_id for r in recs]
    if ids != sorted(ids) or len(set(ids)) != len(ids) or n_after_idle != 1:
        return False, f"record step ids {ids}; records after the idle step: {n_after_idle}"
    return True, f"ids {ids}"


sys.exit(c.verdict(check, "14"))
