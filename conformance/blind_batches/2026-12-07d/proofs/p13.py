"""p13: a fine-tuning-only step polls should_abort at each of its decoder-layer boundaries (2 layers: before layer
0 and before layer 1), and an abort asked at the second boundary stops the step."""
from _common import *

s = sample(1, 9)


def check(cls):
    h = make(cls)
    ic, sk, rec = install(h, plan=lambda b, i: [s] if i in (0, 1) else [], abort=lambda st, i: i == 3)
    h.set_finetune_adapter(ft_state(seed=FT_ADAPTER_SEED))
    h.run_idle_step()
    polls_first = sum(1 for e in sk.events if e[0] == "abort?")
    h.run_idle_step()
    L = h.model_spec().num_layers
    second = rec.records[1] if len(rec.records) > 1 else None
    aborted = second is not None and second.aborted_sample_ids == (1,)
    ok = polls_first == L and (aborted if sk.n_abort >= 4 else False)
    return ok, (f"{L} layers; polls in step 1: {polls_first}; abort wanted at the 2nd boundary of step 2 "
                f"(poll #{4}): polls made {sk.n_abort}, step 2 aborted={aborted}")


run("p13", check, host_module("13").Host)
