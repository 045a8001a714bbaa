"""p26: abort poll with a stale step id. Truth: the step id each fine-tuning-only step was offered with."""
from _common import *

S = [sample(1, 8)]


def check(cls):
    h = make(cls)
    ic, sk, rec = install(h, plan=lambda b, i: S if i < 3 else [])
    h.set_finetune_adapter(ft_state(seed=FT_ADAPTER_SEED))
    ran = [h.run_idle_step() for _ in range(3)]
    offered = [b.step_id for b in ic.batches[:3]]
    polls, cur, bad = [], None, []
    for e in sk.events:
        if e[0] == "begin":
            cur = e[1]
        elif e[0] == "abort?":
            polls.append((cur, e[1]))
            if e[1] != cur:
                bad.append((cur, e[1]))
    return all(ran) and not bad and len(polls) == 6, (
        f"3 fine-tuning-only steps {offered} (2 layers each); (step, id polled) wrong: {bad}")


run("p26", check, host_module("26").Host)
