"""p10: ScheduledRequest.slo is the client request's own SLO."""
from _common import *  # noqa: F401,F403

from deltaserve_core.types import RequestSLO

H = host_module("10").Host
SLO = RequestSLO(ttft_s=1.5, tpot_s=0.2, avg_tpot_s=0.08)


def check(cls):
    h = make(cls)
    ic, sk, rec = install(h)
    h.generate([req("a", 8, 1, 4, slo=SLO), req("b", 8, 2, 4)])
    want = {"a": SLO, "b": None}
    bad, n = [], 0
    for b in ic.batches:
        for s in b.scheduled + b.waiting:
            n += 1
            if s.slo != want[s.request_id]:
                bad.append((b.step_id, s.request_id, s.slo))
    return (not bad and n > 0,
            f"submitted a: {SLO}, b: None; {n} views; wrong (step, id, slo): {bad[:2]}{' ...' if len(bad) > 2 else ''}")


run("p10", check, H)
