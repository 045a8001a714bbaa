"""p22: two prompts prefilled in one step each give HF's greedy continuation (h22: one causal mask over both)."""
from _common import *  # noqa: F403

PS = (prompt(10, 81), prompt(12, 82), prompt(7, 83))
N = 6


def check(cls):
    h = make(cls)
    ic, sk, rec = install(h)
    outs = h.generate([ClientRequest(f"r{i}", p, N) for i, p in enumerate(PS)])
    got = [list(o.token_ids) for o in outs]
    truth = [hf_greedy(p, N) for p in PS]
    wrong = [(f"r{i}", g, t) for i, (g, t) in enumerate(zip(got, truth)) if g != t]
    return not wrong, (f"prompts 10, 12, 7 in step 0 (prefills {rec.records[0].prefill_lengths}); wrong (id, got, "
                       f"truth HF): {wrong}")


run("p22", check, host_module("22").Host)
