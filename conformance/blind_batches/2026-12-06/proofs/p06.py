"""p06: ProposedBatch.mode is the mode the step runs in (no FT rows)."""
from _common import *  # noqa: F401,F403

Base = base_module("_graphs").GraphHost
H = host_module("06").Host


def check(cls):
    h = make(cls)
    ic, sk, rec = install(h)
    h.generate([req("a", 8, 1, 4), req("b", 8, 2, 4)])
    recs = steps_by_id(rec.records)
    rows = [(b.step_id, b.mode.value, recs[b.step_id].mode.value) for b in ic.batches]
    bad = [r for r in rows if r[1] != r[2]]
    return not bad, f"(step, batch.mode, record.mode): {rows}; disagreeing: {len(bad)}"


run_with_base("p06", check, Base, H)
