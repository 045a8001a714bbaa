"""p16: a token's time lies within the step that produced it (after the step started, not after it ended); the
same for ScheduledRequest.first_token_time. One request alone: output token k comes from the k-th step."""
from _common import ClientRequest, host_module, install, make, prompt, run


def check(cls):
    h = make(cls)
    ic, sk, rec = install(h)
    out = h.generate([ClientRequest("r", prompt(6, 4), 4)])[0]
    bad = [f"token {k} at {t:.6f}, its step ran [{r.start_time:.6f}, {r.start_time + r.duration_s:.6f}]"
           for k, (t, r) in enumerate(zip(out.token_times, rec.records))
           if not r.start_time <= t <= r.start_time + r.duration_s + 1e-6]
    first = {q.first_token_time for b in ic.batches for q in b.scheduled if q.first_token_time is not None}
    r0 = rec.records[0]
    bad += [f"ScheduledRequest.first_token_time {t:.6f} before the prefill step started {r0.start_time:.6f}"
            for t in first if t < r0.start_time]
    ok = len(out.token_times) == len(rec.records) == 4 and not bad
    return ok, "token times inside their steps" if ok else "; ".join(bad[:3])


run("p16", check, host_module("16").Host)
