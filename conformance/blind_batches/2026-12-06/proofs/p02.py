"""p02: intercept_schedule(None) removes the interceptor."""
from _common import *  # noqa: F401,F403

H = host_module("02").Host


def check(cls):
    h = make(cls)
    ic = Interceptor()
    h.intercept_schedule(ic)
    h.generate([req("a", 8, 1, 3)])
    n_sched, n_arr = len(ic.batches), len(ic.arrivals)
    h.intercept_schedule(None)
    h.generate([req("b", 8, 2, 3)])
    more_s, more_a = len(ic.batches) - n_sched, len(ic.arrivals) - n_arr
    return (more_s == 0 and more_a == 0 and n_sched == 3,
            f"installed: {n_sched} on_schedule / {n_arr} on_arrival; after intercept_schedule(None) and a 3-token "
            f"request: {more_s} on_schedule / {more_a} on_arrival calls to the removed interceptor")


run("p02", check, H)
