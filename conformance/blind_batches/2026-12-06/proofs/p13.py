"""p13: should_abort at every layer boundary of a fine-tuning-only step, the one before layer 0 included."""
from _common import *  # noqa: F401,F403

H = host_module("13").Host


def check(cls):
    h, ic, sk, rec, ran = idle_capture(cls, [sample(1, 12)])
    asked, pending = [], False
    for e in sk.events:
        if e[0] == "abort?":
            pending = True
        elif e[0] == "layer":
            asked.append((e[2], pending))
            pending = False
    h2 = make(cls)
    ic2, sk2, rec2 = install(h2, plan=lambda b, i: [sample(2, 12)] if i == 0 else [], abort=lambda s, i: True)
    h2.set_finetune_adapter(ft_state(seed=FT_ADAPTER_SEED))
    h2.run_idle_step()
    layers_run = [e[2] for e in sk2.layers()]
    ok = ran and asked == [(0, True), (1, True)] and layers_run == [] and rec2.records[-1].aborted_sample_ids == (2,)
    return ok, (f"2-layer FT-only step: (layer, abort asked before it) {asked}; abort answered True from the first "
                f"question: layers captured before the stop {layers_run}, record aborted {rec2.records[-1].aborted_sample_ids}")


run("p13", check, H)
