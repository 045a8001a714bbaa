"""p17: after calibration steps the host has no client work and step() returns only submitted requests."""
from _common import ClientRequest, drain, host_module, install, make, prompt, run
from deltaserve_core.types import ProfileShape


def check(cls):
    h = make(cls)
    ic, sk, rec = install(h)
    h.run_profile_step(ProfileShape(prefill_lengths=(8, 5)))
    h.run_profile_step(ProfileShape(prefill_lengths=(6,), num_decode=2, decode_context=6))
    pending = h.has_unfinished()
    h.submit(ClientRequest("r", prompt(6, 5), 3))
    outs = drain(h)
    foreign = [o.request_id for o in outs if o.request_id != "r"]
    ok = not pending and not foreign and [o.request_id for o in outs] == ["r"]
    return ok, f"has_unfinished() after calibration: {pending}; outputs {[o.request_id for o in outs]}"


run("p17", check, host_module("17").Host)
