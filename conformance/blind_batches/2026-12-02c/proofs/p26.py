"""p26: a calibration step runs its shape's fine-tuning rows (before any set_finetune_adapter, as calibration is)."""
from _common import *  # noqa: F403
from deltaserve_core.types import ProfileShape


def check(cls):
    h = make(cls)
    ic, sk, rec = install(h)
    r = h.run_profile_step(ProfileShape(prefill_lengths=(8,), finetune_lengths=(16, 8)))
    return r.finetune_lengths == (16, 8), f"shape finetune_lengths (16, 8), record {r.finetune_lengths}"


run("p26", check, host_module("26").Host)
