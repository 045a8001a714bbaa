"""p20: an output kept from generate() is returned by the next step() calls exactly once."""
from _common import *  # noqa: F401,F403
from _common import CACHE  # noqa: F401

H = host_module("20").Host


def check(cls):
    h = make(cls)
    h.submit(req("a", 8, 131, 3))
    first = h.step()
    g = h.generate([req("b", 8, 132, 8)])
    later = [ids_of(h.step()) for _ in range(3)]
    n = sum(x.count("a") for x in later) + ids_of(first).count("a") + ids_of(g).count("a")
    return n == 1, f"submit(a, 3 tokens), step -> {ids_of(first)}, generate([b, 8 tokens]) -> {ids_of(g)}; " \
                   f"next 3 step() -> {later}; has_unfinished {h.has_unfinished()}"


run("p20", check, H)
