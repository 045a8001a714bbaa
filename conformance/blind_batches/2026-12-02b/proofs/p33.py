"""h33: StepRecord.start_time is time.monotonic() of the scheduling process."""
import sys
import time
import _common as c


def check(cls):
    h = c.make(cls)
    ic, sink, recs = c.install(h, plan=[(c.sample(25, 8),)])
    t0 = time.monotonic()
    h.run_idle_step()
    h.generate([c.ClientRequest("r", c.prompt(5), 2)])
    t1 = time.monotonic()
    bad = [r.start_time for r in recs if not t0 <= r.start_time <= t1]
    return (not bad), f"start times outside [{t0:.1f}, {t1:.1f}]: {bad[:2]}"


sys.exit(c.verdict(check, "33"))
