"""p26: shutdown() returns with requests pending, without running them."""
from _common import *  # noqa: F401,F403

H = host_module("26").Host


def check(cls):
    h = make(cls)
    ic, sk, rec = install(h)
    h.submit(req("a", 8, 1, 150))
    h.step()
    n0 = len(rec.records)
    t0 = time.monotonic()
    h.shutdown()
    dt = time.monotonic() - t0
    n = len(rec.records) - n0
    return (n == 0 and not h.has_unfinished(),
            f"request with 149 tokens left: {n} steps ran inside shutdown() ({dt:.2f} s); has_unfinished after: {h.has_unfinished()}")


run("p26", check, H)
