"""h19: a second set_finetune_adapter with the same name and version but other weights is what later steps use."""
import sys
import _common as c


def check(cls):
    h = c.make(cls)
    first, second = c.lora_state(seed=3, version=5), c.lora_state(seed=9, version=5)
    s = c.sample(17, 10)
    ic, sink, recs = c.install(h, plan=[(s,)], adapter=first)
    h.set_finetune_adapter(second)  # e.g. after a restart rewound the job to step 5
    assert h.run_idle_step()
    return c.check_captures(sink, [s], second)


sys.exit(c.verdict(check, "19"))
