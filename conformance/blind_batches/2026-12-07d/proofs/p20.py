"""p20: a fine-tuning-only step aborted at its first boundary: begin_step of that step comes once, before its
end_step."""
from _common import *

s = sample(1, 9)


def check(cls):
    h = make(cls)
    ic, sk, rec = install(h, plan=lambda b, i: [s] if i == 0 else [], abort=lambda st, i: i == 0)
    h.set_finetune_adapter(ft_state(seed=FT_ADAPTER_SEED))
    h.run_idle_step()
    seq = [(e[0], e[1]) for e in sk.events if e[0] in ("begin", "end")]
    ok = len(seq) == 2 and seq[0][0] == "begin" and seq[1][0] == "end" and seq[0][1] == seq[1][1]
    return ok, f"aborted before layer 0 (record aborted {rec.records[0].aborted_sample_ids}); sink calls {seq}"


run("p20", check, host_module("20").Host)
