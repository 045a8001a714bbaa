"""h03: captures have capabilities().activation_dtype, also for a long (80-token) sample."""
import sys
import _common as c


def check(cls):
    h = c.make(cls)
    s = c.sample(3, 80)
    ic, sink, recs = c.install(h, plan=[(s,)])
    assert h.run_idle_step()
    want = h.capabilities().activation_dtype
    bad = {str(t.dtype) for t in sink.inputs.values() if str(t.dtype) != f"torch.{want}"}
    if bad:
        return False, f"declared activation_dtype={want}, captured {bad}"
    return c.check_captures(sink, [s])


sys.exit(c.verdict(check, "03"))
