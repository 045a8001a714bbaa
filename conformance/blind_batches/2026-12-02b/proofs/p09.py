"""h09: step() returns outputs of submitted client requests only, never of fine-tuning rows."""
import sys
import _common as c


def check(cls):
    h = c.make(cls)
    ic, sink, recs = c.install(h, plan=[(c.sample(10, 8),), (c.sample(11, 8),)])
    h.submit(c.ClientRequest("r0", c.prompt(5), 3))
    outs = c.drain(h)
    ids = sorted(o.request_id for o in outs)
    return (ids == ["r0"]), f"step() returned {ids}"


sys.exit(c.verdict(check, "09"))
