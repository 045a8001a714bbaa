"""p25: kept list rebound. Truth: which requests were submitted and which call returned each output."""
from _common import *


def check(cls):
    h = make(cls)
    h.submit(req("x", 10, 251, 3))
    got = h.generate([req("y", 12, 252, 8)])  # x finishes inside this call
    later = drain(h)
    ids = ([o.request_id for o in got], [o.request_id for o in later])
    return ids == (["y"], ["x"]), f"submit(x, 3 tokens), generate([y, 8 tokens]) -> {ids[0]}; later step() -> {ids[1]}"


run("p25", check, host_module("25").Host)
