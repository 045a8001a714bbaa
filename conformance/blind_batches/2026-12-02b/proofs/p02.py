"""h02: the residual-stream input of every layer is captured (fine-tuning-only step)."""
import sys
import _common as c


def check(cls):
    h = c.make(cls)
    s = c.sample(2, 16)
    ic, sink, recs = c.install(h, plan=[(s,)])
    assert h.run_idle_step()
    return c.check_captures(sink, [s])


sys.exit(c.verdict(check, "02"))
