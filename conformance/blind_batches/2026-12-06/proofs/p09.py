"""p09: ScheduledRequest.output_tokens counts the tokens generated so far."""
from _common import *  # noqa: F401,F403

H = host_module("09").Host


def check(cls):
    h = make(cls)
    ic, sk, rec = install(h)
    out = h.generate([req("a", 10, 3, 6)])[0]
    bad = []
    for k, b in enumerate(ic.batches):
        for s in b.scheduled:
            if s.output_tokens != k:  # step k runs after k tokens were generated
                bad.append((k, s.output_tokens, k))
    return (len(ic.batches) == 6 and len(out.token_ids) == 6 and not bad,
            f"6 tokens over {len(ic.batches)} steps; wrong (step, output_tokens, truth): {bad}")


run("p09", check, H)
