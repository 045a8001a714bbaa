"""p09: ScheduledRequest.slo is the client's own slo, exactly as submitted (types.py, ScheduledRequest)."""
import _common as c
from deltaserve_core.types import RequestSLO


def check(cls):
    slo = RequestSLO(ttft_s=2.0, tpot_s=0.5)
    h = c.make(cls)
    ic, sk, rec = c.install(h)
    h.submit(c.req("r", 6, 9, 4, slo=slo))
    c.drain(h)
    views = [(b.step_id, r.prefill_tokens, r.slo) for b in ic.batches for r in b.scheduled + b.waiting
             if r.request_id == "r"]
    wrong = [(s, p, v) for s, p, v in views if v != slo]
    return not wrong, f"{len(views)} views of r (slo {slo}); wrong (step, prefill_tokens, slo): {wrong}"


c.run("p09", check, c.host_module("09").Host)
