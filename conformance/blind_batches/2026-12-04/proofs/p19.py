"""p19: report_step_time(None) removes the step sink: it is never called again."""
from _common import *  # noqa: F403

H = host_module("19").Host


def check(cls):
    h = make(cls)
    ic, sk, rec = install(h)
    h.generate([ClientRequest("a", prompt(6, 1), 3)])
    before = len(rec.records)
    h.intercept_schedule(None)
    h.capture_activation(None)
    h.report_step_time(None)  # the job stopped; the engine keeps serving
    h.generate([ClientRequest("b", prompt(7, 2), 3)])
    after = len(rec.records) - before
    return after == 0, f"{before} records while installed; {after} delivered to the removed sink afterwards"


run("p19", check, H)
