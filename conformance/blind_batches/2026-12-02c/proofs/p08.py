"""p08: on_arrival is called exactly once per client request."""
from _common import *  # noqa: F403


def check(cls):
    h = make(cls)
    ic, sk, rec = install(h)
    h.generate([ClientRequest("a", prompt(8, 1), 2), ClientRequest("b", prompt(6, 2), 2)])
    ids = [a[0] for a in ic.arrivals]
    return sorted(ids) == ["a", "b"], f"arrivals: {ids}"


run("p08", check, host_module("08").Host)
