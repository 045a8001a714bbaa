"""p03: has_unfinished() is False after a fine-tuning-only step with no client request."""
from _common import *  # noqa: F401,F403

H = host_module("03").Host


def check(cls):
    h = make(cls)
    ic, sk, rec = install(h, plan=lambda b, i: [sample(1, 12), sample(2, 9)] if i == 0 else [])
    h.set_finetune_adapter(ft_state(seed=FT_ADAPTER_SEED))
    before = h.has_unfinished()
    ran = h.run_idle_step()
    after = h.has_unfinished()
    return (ran and not before and not after,
            f"no client request submitted; has_unfinished() before/after a fine-tuning-only step (ran={ran}): "
            f"{before}/{after}")


run("p03", check, H)
