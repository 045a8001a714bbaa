"""p15: after a calibration step on a host with no client request, has_unfinished() is False."""
from _common import *
from deltaserve_core.types import ProfileShape


def check(cls):
    h = make(cls)
    install(h)
    h.run_profile_step(ProfileShape(prefill_lengths=(8,), num_decode=2, decode_context=16))
    u = h.has_unfinished()
    return not u, f"no client request submitted; has_unfinished() after run_profile_step: {u}"


run("p15", check, host_module("15").Host)
