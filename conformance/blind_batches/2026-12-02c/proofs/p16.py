"""p16: generate() returns one output per request, in request order."""
from _common import *  # noqa: F403


def check(cls):
    h = make(cls)
    outs = h.generate([ClientRequest("long", prompt(8, 1), 4), ClientRequest("short", prompt(6, 2), 1)])
    ids = [o.request_id for o in outs]
    return ids == ["long", "short"], f"outputs in order {ids}"


run("p16", check, host_module("16").Host)
