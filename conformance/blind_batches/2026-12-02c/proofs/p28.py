"""p28: after intercept_schedule(B) replaced A, arrivals go to B and A is never called again."""
from _common import *  # noqa: F403


def check(cls):
    h = make(cls)
    a, b = Interceptor(), Interceptor()
    h.intercept_schedule(a)
    h.intercept_schedule(b)
    h.generate([ClientRequest("x", prompt(8, 1), 2)])
    return (not a.arrivals and not a.batches and [x[0] for x in b.arrivals] == ["x"],
            f"old interceptor: {len(a.arrivals)} arrivals, {len(a.batches)} batches; new: {len(b.arrivals)} arrivals")


run("p28", check, host_module("28").Host)
