"""p22: ScheduledRequest.first_token_time is the first token's time, last_token_time the latest's."""
from _common import *  # noqa: F403


def check(cls):
    h = make(cls)
    ic, sk, rec = install(h)
    out = h.generate([ClientRequest("a", prompt(8, 1), 4)])[0]
    bad = []
    for i, b in enumerate(ic.batches):
        r = b.scheduled[0]
        if i == 0:
            continue
        want = (out.token_times[0], out.token_times[i - 1])
        if (r.first_token_time, r.last_token_time) != want:
            bad.append(f"step {i}: (first, last) = ({r.first_token_time}, {r.last_token_time}), tokens at {want}")
    return not bad, "token times right" if not bad else "; ".join(bad[:2])


run("p22", check, host_module("22").Host)
