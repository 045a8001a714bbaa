"""p10: a record's kv_tokens is the KV its decodes read (prompt + outputs so far - 1 per decode)."""
from _common import *  # noqa: F403


def check(cls):
    h = make(cls)
    ic, sk, rec = install(h)
    h.generate([ClientRequest("a", prompt(8, 1), 4), ClientRequest("b", prompt(5, 2), 4)])
    bad = []
    for i, r in enumerate(rec.records):
        want = (8 + i - 1) + (5 + i - 1) if i else 0
        if r.kv_tokens != want:
            bad.append(f"step {i}: kv_tokens {r.kv_tokens}, read {want}")
    return not bad, "kv_tokens right" if not bad else "; ".join(bad)


run("p10", check, host_module("10").Host)
