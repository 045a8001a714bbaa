"""p16: a submit()ted request still running when generate() is called is returned later (h16: dropped by generate)."""
from _common import *  # noqa: F403


def check(cls):
    h = make(cls)
    h.submit(req("a", 8, 1, 20))
    h.step()
    outs = h.generate([req("b", 6, 2, 3)])
    after = h.has_unfinished()
    later = drain(h)
    ok = [o.request_id for o in outs] == ["b"] and [o.request_id for o in later] == ["a"]
    return ok, (f"submit('a', 20 tokens), step, generate(['b', 3 tokens]) -> {[o.request_id for o in outs]}; "
                f"has_unfinished() after {after}; later step() outputs {[o.request_id for o in later]} "
                f"('a' returned by no call: {'a' not in [o.request_id for o in later]})")


run("p16", check, host_module("16").Host)
