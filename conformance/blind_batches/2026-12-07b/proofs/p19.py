"""p19: a calibration step with two fine-tuning rows reports two sample ids beside two lengths."""
from _common import *  # noqa: F401,F403
from _common import CACHE  # noqa: F401

from deltaserve_core.types import ProfileShape  # noqa: E402

H = host_module("19").Host


def check(cls):
    h = make(cls)
    ic, sk, rec = install(h)
    r = h.run_profile_step(ProfileShape(prefill_lengths=(8,), finetune_lengths=(6, 5)))
    pairs = [(x.finetune_sample_ids, x.finetune_lengths) for x in [r] + rec.records]
    ok = all(len(ids) == len(ls) == 2 for ids, ls in pairs)
    return ok, f"shape prefill (8,), finetune (6, 5); (ids, lengths) returned and delivered: {pairs}"


run("p19", check, H)
