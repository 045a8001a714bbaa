"""p34: a step whose captures fired is recorded EAGER."""
from _common import *  # noqa: F401,F403

from deltaserve_core.types import ExecutionMode

Base = base_module("_graphs").GraphHost
H = host_module("34").Host
SMP = sample(1, 12)


def check(cls):
    h = make(cls)
    ic, sk, rec = install(h, plan=lambda b, i: [SMP] if i == 2 else [])
    h.set_finetune_adapter(ft_state(seed=FT_ADAPTER_SEED))
    h.generate([req("a", 8, 1, 5)])
    captured = sorted({e[1] for e in sk.layers()})
    recs = steps_by_id(rec.records)
    rows = [(s, recs[s].mode.value, recs[s].finetune_sample_ids) for s in captured]
    ok = captured == [2] and all(recs[s].mode is ExecutionMode.EAGER for s in captured)
    return ok, (f"sample injected into decode step 2 of one request; steps whose capture hooks fired: {captured}; "
                f"(step, record.mode, ran): {rows}")


run_with_base("p34", check, Base, H)
