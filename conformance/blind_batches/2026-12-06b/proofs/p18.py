"""p18: after capture_activation(None) the removed sink is never called again (h18: None ignored)."""
from _common import *  # noqa: F403


def check(cls):
    h = make(cls)
    ic, sk, rec = install(h, plan=lambda b, i: [sample(10 + i, 8)])
    h.set_finetune_adapter(ft_state(seed=FT_ADAPTER_SEED))
    h.run_idle_step()
    before = len(sk.events)
    h.capture_activation(None)
    ran = h.run_idle_step()
    late = [e[0] for e in sk.events[before:]]
    return not late, (f"sink got {before} calls in step 0; after capture_activation(None), step 1 (ran={ran}): "
                      f"calls to the removed sink {late}")


run("p18", check, host_module("18").Host)
