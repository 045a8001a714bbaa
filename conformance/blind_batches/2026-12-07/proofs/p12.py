"""p12: a submit()ted request that finished inside generate() is unfinished until a step() returns it."""
from _common import *  # noqa: F403

Host = host_module("12").Host


def check(cls):
    h = make(cls)
    h.submit(req("a", 8, 121, 3))
    first = h.step()
    res = h.generate([req("b", 9, 122, 8)])
    hu = h.has_unfinished()
    later = h.step() if hu else []
    return hu and ids_of(later) == ["a"], (f"submit(a, 3 tokens), step -> {ids_of(first)}, generate([b, 8 tokens]) -> "
                                           f"{ids_of(res)}; has_unfinished() after: {hu}; next step() -> {ids_of(later)}")


run("p12", check, Host)
