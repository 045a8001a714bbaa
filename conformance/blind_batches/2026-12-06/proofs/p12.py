"""p12: end_step for a step with fine-tuning rows and client rows."""
from _common import *  # noqa: F401,F403

H = host_module("12").Host
SMP = sample(1, 12)


def check(cls):
    h = make(cls)
    ic, sk, rec = install(h, plan=lambda b, i: [SMP] if i == 0 else [])
    h.set_finetune_adapter(ft_state(seed=FT_ADAPTER_SEED))
    h.generate([req("a", 8, 1, 3)])
    kinds = [e[0] for e in sk.events]
    ends = [e[1:] for e in sk.events if e[0] == "end"]
    ok = kinds == ["begin", "layer", "layer", "end"] and ends == [(0, (1,), ())]
    return ok, f"mixed step 0 (prompt 8 + sample 1): sink calls {kinds}; end_step calls {ends}; record ran {rec.records[0].finetune_sample_ids}"


run("p12", check, H)
