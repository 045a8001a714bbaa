"""p05: an aborted fine-tuning-only step calls end_step with every sample aborted, none completed."""
from _common import *  # noqa: F403


def check(cls):
    h = make(cls)
    h.set_finetune_adapter(ft_state())
    s0, s1 = sample(0, 10), sample(1, 8)
    ic, sk, rec = install(h, plan=lambda b, i: [s0, s1] if i == 0 else (), abort=lambda st, k: k >= 1)
    h.run_idle_step()
    ends = [e for e in sk.events if e[0] == "end"]
    ok = len(ends) == 1 and ends[0][2] == () and sorted(ends[0][3]) == [0, 1]
    return ok, f"end_step calls {[(e[2], e[3]) for e in ends]} (completed, aborted)"


run("p05", check, host_module("05").Host)
