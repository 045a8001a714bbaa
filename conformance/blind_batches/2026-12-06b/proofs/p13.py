"""p13: a calibration step with fine-tuning rows never calls the activation sink (its step was never offered)."""
from _common import *  # noqa: F403
from deltaserve_core.types import ProfileShape  # noqa: E402


def check(cls):
    h = make(cls)
    ic, sk, rec = install(h)
    h.set_finetune_adapter(ft_state(seed=FT_ADAPTER_SEED))
    r = h.run_profile_step(ProfileShape(prefill_lengths=(8,), finetune_lengths=(12,)))
    offered = {b.step_id for b in ic.batches}
    stray = [(e[0], e[1]) + ((e[2], e[3]) if e[0] == "layer" else ()) for e in sk.events if e[1] not in offered]
    return not stray, (f"profile step {r.step_id} (prefill 8, ft 12), steps offered to on_schedule {sorted(offered)}; "
                       f"sink calls for steps never offered: {stray[:5]}")


run("p13", check, host_module("13").Host)
