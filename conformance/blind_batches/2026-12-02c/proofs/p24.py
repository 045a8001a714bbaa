"""p24: a request's own SLO is the ScheduledRequest's slo."""
from _common import *  # noqa: F403
from deltaserve_core.types import RequestSLO

SLO = RequestSLO(ttft_s=0.5, tpot_s=0.05)


def check(cls):
    h = make(cls)
    ic, sk, rec = install(h)
    h.generate([ClientRequest("a", prompt(8, 1), 3, slo=SLO)])
    got = {b.scheduled[0].slo for b in ic.batches}
    return got == {SLO}, f"slo seen by the core: {got}"


run("p24", check, host_module("24").Host)
