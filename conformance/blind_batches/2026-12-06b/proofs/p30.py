"""p30: when each step's record arrives, has_unfinished() is True while a request's output is not yet returned."""
from _common import *  # noqa: F403


def check(cls):
    h = make(cls)
    seen = []
    h.report_step_time(lambda r: seen.append((r.step_id, h.has_unfinished())))
    h.submit(req("a", 8, 1, 3))
    outs = drain(h)
    bad = [s for s in seen if not s[1]]
    return not bad and [o.request_id for o in outs] == ["a"], (
        f"lone 3-token request; at each record (step, has_unfinished()): {seen}; returned {[o.request_id for o in outs]}")


run("p30", check, host_module("30").Host)
