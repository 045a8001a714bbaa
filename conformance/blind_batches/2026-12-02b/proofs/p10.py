"""h10: every sample returned by on_schedule is in that step's record (completed or refused), never in a later one."""
import sys
import _common as c


def check(cls):
    h = c.make(cls, max_batch_tokens=64)
    s1, s2 = c.sample(12, 20), c.sample(13, 20)
    given = {}

    def policy(batch):
        if not given:
            given[batch.step_id] = (s1, s2)
            return (s1, s2)
        return ()

    ic, sink, recs = c.install(h, policy=policy)
    h.submit(c.ClientRequest("r0", c.prompt(40), 3))
    c.drain(h)
    (sid, samples), = given.items()
    by = {r.step_id: r for r in recs}
    r = by.get(sid)
    if r is None:
        return False, "no record for the step"
    seen = set(r.finetune_sample_ids) | set(r.aborted_sample_ids)
    later = [x.step_id for x in recs if x.step_id != sid and (set(x.finetune_sample_ids) & {s1.sample_id, s2.sample_id})]
    if seen != {s1.sample_id, s2.sample_id} or later:
        return False, f"step {sid} record has {sorted(seen)}; samples ran again in steps {later}"
    return True, f"step record ft={r.finetune_sample_ids} aborted={r.aborted_sample_ids}"


sys.exit(c.verdict(check, "10"))
