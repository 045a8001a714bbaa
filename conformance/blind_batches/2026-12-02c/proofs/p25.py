"""p25: a profile step asked for GRAPH on an eager-only host reports the mode it ran in (a declared mode)."""
from _common import *  # noqa: F403
from deltaserve_core.types import ExecutionMode, ProfileShape


def check(cls):
    h = make(cls)
    ic, sk, rec = install(h)
    modes = h.capabilities().graph_modes
    r = h.run_profile_step(ProfileShape(prefill_lengths=(8,), num_decode=2, decode_context=16,
                                        mode=ExecutionMode.GRAPH))
    got = {r.mode} | {x.mode for x in rec.records}
    return got <= modes, f"graph_modes {sorted(m.value for m in modes)}, record modes {sorted(m.value for m in got)}"


run("p25", check, host_module("25").Host)
