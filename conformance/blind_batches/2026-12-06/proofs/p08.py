"""p08: ScheduledRequest.context_tokens is the KV length before the step."""
from _common import *  # noqa: F401,F403

H = host_module("08").Host


def check(cls):
    h = make(cls)
    ic, sk, rec = install(h)
    h.generate([req("a", 10, 3, 8)])
    bad, n = [], 0
    for k, b in enumerate(ic.batches):
        for s in b.scheduled:
            truth = 0 if k == 0 else 10 + k - 1  # prompt + tokens generated - the one decoded now
            n += 1
            if s.context_tokens != truth:
                bad.append((k, s.context_tokens, truth))
    return (n == 8 and not bad,
            f"prompt 10, 8 tokens: {n} views; wrong (step, context_tokens, truth): {bad[:4]}{' ...' if len(bad) > 4 else ''}")


run("p08", check, H)
