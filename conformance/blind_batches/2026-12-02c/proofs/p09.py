"""p09: a decode's context_tokens is the KV it attends over before the step: prompt + outputs so far - 1."""
from _common import *  # noqa: F403


def check(cls):
    h = make(cls)
    ic, sk, rec = install(h)
    h.generate([ClientRequest("a", prompt(8, 1), 4)])
    bad = []
    for i, b in enumerate(ic.batches):
        for r in b.scheduled:
            if r.is_decode and r.context_tokens != 8 + i - 1:  # step i decodes the request's i-th output
                bad.append(f"step {i}: context_tokens {r.context_tokens}, KV before the step {8 + i - 1}")
    return not bad and len(ic.batches) == 4, "decode contexts right" if not bad else "; ".join(bad)


run("p09", check, host_module("09").Host)
