"""p06: once should_abort answered True, the forward stops at that boundary: no layer input is delivered after."""
from _common import *  # noqa: F403


def check(cls):
    h = make(cls)
    h.set_finetune_adapter(ft_state())
    s = sample(0, 10)
    ic, sk, rec = install(h, plan=lambda b, i: [s] if i == 0 else (), abort=lambda st, k: k >= 1)
    h.run_idle_step()
    ev = sk.events
    first = next((i for i, e in enumerate(ev) if e[0] == "abort?" and e[2]), None)
    after = [e[2] for e in ev[first + 1:] if e[0] == "layer"] if first is not None else []
    ends = [e for e in ev if e[0] == "end"]
    ok = first is not None and not after and ends and ends[0][3] == (0,)
    return ok, (f"abort answered at poll {first}; layer inputs delivered after it for layers {after}; "
                f"end_step {[(e[2], e[3]) for e in ends]}")


run("p06", check, host_module("06").Host)
