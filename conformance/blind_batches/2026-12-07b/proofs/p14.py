"""p14: ScheduledRequest.slo is the request's own slo: None without one, equal with one."""
from _common import *  # noqa: F401,F403
from _common import CACHE  # noqa: F401

H = host_module("14").Host


def check(cls):
    h = make(cls)
    ic, sk, rec = install(h)
    slo = RequestSLO(ttft_s=1.0, tpot_s=0.2)
    h.generate([req("a", 8, 91, 3), req("b", 8, 92, 3, slo=slo)])
    want = {"a": None, "b": slo}
    bad = sorted({(r.request_id, repr(r.slo)) for b in ic.batches for r in b.scheduled + b.waiting
                  if r.slo != want[r.request_id] or (want[r.request_id] is None and r.slo is not None)})
    return not bad, f"a without SLO, b with {slo}; views with another slo: {bad}"


from deltaserve_core.types import RequestSLO  # noqa: E402

run("p14", check, H)
