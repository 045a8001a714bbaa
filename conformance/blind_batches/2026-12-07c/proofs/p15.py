"""p15: sticky SLO default. Truth: the SLOs as submitted."""
from _common import *
from deltaserve_core.types import RequestSLO

SLO = RequestSLO(ttft_s=1.0, tpot_s=0.2)


def check(cls):
    h = make(cls)
    ic, sk, rec = install(h)
    reqs = [req("a", 10, 151, 4, slo=SLO), req("b", 9, 152, 4)]
    h.generate(reqs)
    want = {r.request_id: r.slo for r in reqs}
    bad = sorted({(v.request_id, repr(v.slo)) for bt in ic.batches for v in bt.scheduled + bt.waiting
                  if v.slo != want[v.request_id]})
    return not bad, f"a with {SLO}, b without; views with another slo: {bad}"


run("p15", check, host_module("15").Host)
