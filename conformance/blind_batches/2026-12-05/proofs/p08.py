"""p08: ScheduledRequest.first_token_time never changes once set (types.py, ScheduledRequest)."""
import _common as c


def check(cls):
    h = c.make(cls)
    ic, sk, rec = c.install(h)
    h.submit(c.req("r", 5, 8, 24))
    outs = c.drain(h)
    seen = []
    for b in ic.batches:
        for r in b.scheduled + b.waiting:
            if r.request_id == "r" and r.first_token_time is not None:
                seen.append(r.first_token_time)
    distinct = sorted(set(seen))
    ok = len(distinct) == 1 and distinct[0] == outs[0].first_token_time
    return ok, (f"{len(seen)} views with a first token; distinct first_token_time values: {len(distinct)}"
                f" (client first token at {outs[0].first_token_time - outs[0].arrival_time:.4f}s after arrival; views "
                f"say {[round(t - outs[0].arrival_time, 4) for t in distinct[:3]]}{'...' if len(distinct) > 3 else ''})")


c.run("p08", check, c.host_module("08").Host)
