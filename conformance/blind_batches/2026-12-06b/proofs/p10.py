"""p10: at each step a lone request's ScheduledRequest.last_token_time is the time of its latest token (h10: stream lag)."""
from _common import *  # noqa: F403

N = 10


def check(cls):
    h = make(cls)
    ic, sk, rec = install(h)
    out = h.generate([req("a", 6, 3, N)])[0]
    wrong = []
    for k, b in enumerate(ic.batches):
        v = [s for s in b.scheduled if s.request_id == "a"][0]
        truth = out.token_times[k - 1] if k >= 1 else None
        if v.last_token_time != truth:
            idx = out.token_times.index(v.last_token_time) if v.last_token_time in out.token_times else None
            wrong.append((k, v.output_tokens, idx))
    return not wrong, (f"{N} tokens over {len(ic.batches)} steps; wrong (step, output_tokens, index of the token "
                       f"whose time was given; truth output_tokens - 1): {wrong[:6]}")


run("p10", check, host_module("10").Host)
