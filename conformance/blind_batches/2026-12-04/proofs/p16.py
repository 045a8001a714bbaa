"""p16: only calibration steps are synthetic; served steps after calibration are not."""
from _common import *  # noqa: F403
from deltaserve_core.types import ProfileShape

H = host_module("16").Host


def check(cls):
    h = make(cls)
    ic, sk, rec = install(h)
    for shape in (ProfileShape(prefill_lengths=(8,)), ProfileShape(num_decode=2, decode_context=16)):
        h.run_profile_step(shape)
    n_cal = len(rec.records)
    h.generate([ClientRequest("a", prompt(6, 1), 3), ClientRequest("b", prompt(7, 2), 3)])
    flags = [r.synthetic for r in rec.records]
    truth = [True] * n_cal + [False] * (len(flags) - n_cal)
    return flags == truth, f"synthetic flags {flags} ({n_cal} calibration steps, then served), truth {truth}"


run("p16", check, H)
