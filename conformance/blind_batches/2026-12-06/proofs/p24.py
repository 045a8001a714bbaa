"""p24: has_unfinished() counts a request just submitted."""
from _common import *  # noqa: F401,F403

H = host_module("24").Host


def check(cls):
    h = make(cls)
    h.submit(req("a", 8, 1, 3))
    pending = h.has_unfinished()
    outs = drain(h)
    return (pending and ids_of(outs) == ["a"],
            f"submit('a') then has_unfinished() -> {pending}; drain (step while has_unfinished) returned {ids_of(outs)}")


run("p24", check, H)
