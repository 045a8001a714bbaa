"""h35: after capture_activation(new) the old sink is never called again (abort polls included)."""
import sys
import _common as c


def check(cls):
    h = c.make(cls)
    ic, old, recs = c.install(h, plan=[(c.sample(27, 8),)])
    new = c.Sink()
    h.capture_activation(new)
    assert h.run_idle_step()
    if old.events:
        return False, f"old sink got {[e[0] for e in old.events]}"
    return (new.abort_calls > 0), f"new sink polled {new.abort_calls} times"


sys.exit(c.verdict(check, "35"))
