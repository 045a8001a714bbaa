"""p33: every record's mode is one of capabilities().graph_modes."""
from _common import *  # noqa: F401,F403

Base = base_module("_graphs").GraphHost
H = host_module("33").Host


def check(cls):
    h = make(cls)
    ic, sk, rec = install(h)
    h.generate([req("a", 8, 1, 4), req("b", 8, 2, 4)])
    modes = h.capabilities().graph_modes
    used = sorted({r.mode.value for r in rec.records})
    bad = [r.step_id for r in rec.records if r.mode not in modes]
    return not bad, f"declared graph_modes {sorted(m.value for m in modes)}, records ran in {used}; outside: steps {bad}"


run_with_base("p33", check, Base, H)
