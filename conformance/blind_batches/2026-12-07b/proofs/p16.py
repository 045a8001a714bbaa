"""p16: the step() call that runs a request's last token returns it."""
from _common import *  # noqa: F401,F403
from _common import CACHE  # noqa: F401

H = host_module("16").Host


def check(cls):
    h = make(cls)
    ic, sk, rec = install(h)
    h.submit(req("a", 10, 111, 3))
    calls = []
    for i in range(1, 6):
        outs = h.step()
        calls.append((i, len(rec.records), ids_of(outs)))
    returned = [i for i, _, ids in calls if "a" in ids]
    # one token per executed step: the 3rd executed step produces the last of 3 tokens
    ok = returned == [3] and calls[2][1] == 3
    return ok, f"3 tokens; (step() call, records so far, returned): {calls}"


run("p16", check, H)
