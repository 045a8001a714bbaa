"""p07: a request the host refuses (unknown adapter) is not announced with on_arrival."""
from _common import *  # noqa: F403


def check(cls):
    h = make(cls)
    ic, sk, rec = install(h)
    refused = False
    try:
        h.submit(ClientRequest("typo", prompt(8, 1), 2, adapter="no-such-adapter"))
    except ValueError:
        refused = True
    h.generate([ClientRequest("ok", prompt(8, 2), 1)])
    ids = [a[0] for a in ic.arrivals]
    return refused and ids == ["ok"], f"refused={refused}, arrivals announced: {ids}"


run("p07", check, host_module("07").Host)
