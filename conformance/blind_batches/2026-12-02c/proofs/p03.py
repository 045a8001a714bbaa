"""p03: on a bf16 host, the dtype of captured layer inputs is the declared activation_dtype."""
from _common import *  # noqa: F403


def check(cls):
    h = make(cls, dtype="bfloat16")
    h.set_finetune_adapter(ft_state())
    s = sample(0, 10)
    ic, sk, rec = install(h, plan=lambda b, i: [s] if i == 0 else ())
    h.run_idle_step()
    declared = h.capabilities().activation_dtype
    got = {str(e[4].dtype).replace("torch.", "") for e in sk.layers()}
    ok = bool(got) and got == {declared}
    return ok, f"declared {declared!r}, captures {sorted(got)}"


run("p03", check, host_module("03").Host)
