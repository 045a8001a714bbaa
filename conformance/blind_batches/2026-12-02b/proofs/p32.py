"""h32: fine-tuning rows are retired after their forward: no unfinished work afterwards, the next idle step runs."""
import sys
import _common as c


def check(cls):
    h = c.make(cls)
    ic, sink, recs = c.install(h, plan=[(c.sample(23, 8),), (c.sample(24, 8),)])
    assert h.run_idle_step()
    if h.has_unfinished():
        return False, "has_unfinished() is True after a fine-tuning-only step with no client request"
    if not h.run_idle_step():
        return False, "second idle step refused"
    return True, "retired"


sys.exit(c.verdict(check, "32"))
