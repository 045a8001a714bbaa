"""p14: graph_mode agrees with the record mode (3 decodes)."""
from _common import *  # noqa: F401,F403

Base = base_module("_graphs").GraphHost
H = host_module("14").Host


def check(cls):
    h = make(cls)
    ic, sk, rec = install(h)
    h.generate([req(f"r{i}", 8, 20 + i, 4) for i in range(3)])
    recs = steps_by_id(rec.records)
    rows = [(b.step_id, b.num_decode, h.graph_mode(b).value, recs[b.step_id].mode.value) for b in ic.batches]
    bad = [r for r in rows if r[2] != r[3]]
    return not bad, f"(step, decodes, graph_mode, record.mode): {rows}; disagreeing {len(bad)}"


run_with_base("p14", check, Base, H)
