"""h04: in a step with a client prompt and two samples, only the samples are captured, each correctly."""
import sys
import _common as c


def check(cls):
    h = c.make(cls)
    s1, s2 = c.sample(4, 10), c.sample(5, 14)
    ic, sink, recs = c.install(h, plan=[(s1, s2)])
    h.submit(c.ClientRequest("r0", c.prompt(9), 2))
    h.step()
    return c.check_captures(sink, [s1, s2])


sys.exit(c.verdict(check, "04"))
