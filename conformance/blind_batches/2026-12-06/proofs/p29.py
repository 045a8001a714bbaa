"""p29: step records count every request that ran, those finishing in it too."""
from _common import *  # noqa: F401,F403

H = host_module("29").Host
LENS = {"a": (8, 3), "b": (12, 6)}  # prompt, max_tokens


def check(cls):
    h = make(cls)
    ic, sk, rec = install(h)
    h.generate([req("a", 8, 1, 3), req("b", 12, 2, 6)])
    bad = []
    for r in rec.records:
        k = r.step_id
        if k == 0:
            truth = ((8, 12), 0, 0)
        else:
            dec = [(p, m) for p, m in LENS.values() if m > k]  # step k gives each request its (k+1)-th token
            truth = ((), len(dec), sum(p + k - 1 for p, m in dec))
        got = (r.prefill_lengths, r.num_decode, r.kv_tokens)
        if got != truth:
            bad.append((k, got, truth))
    return (len(rec.records) == 6 and not bad,
            f"a (8, 3 tokens) + b (12, 6 tokens), {len(rec.records)} records; wrong (step, (prefill, decodes, kv), truth): {bad}")


run("p29", check, H)
