"""p07: run_idle_step returns False (and no step record) when the interceptor adds nothing, True when it adds a
sample and the step runs."""
from _common import ft_state, host_module, install, make, run, sample

S = sample(1, 8)


def check(cls):
    h = make(cls)
    ic, sk, rec = install(h, plan=lambda b, i: [S] if i == 1 else [])
    h.set_finetune_adapter(ft_state())
    r0 = h.run_idle_step()
    n0 = len(rec.records)
    r1 = h.run_idle_step()
    n1 = len(rec.records)
    ok = r0 is False and n0 == 0 and r1 is True and n1 == 1
    return ok, f"empty offer -> {r0} ({n0} records); offer with a sample -> {r1} ({n1} records in all)"


run("p07", check, host_module("07").Host)
