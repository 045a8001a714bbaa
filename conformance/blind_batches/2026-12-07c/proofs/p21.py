"""p21: captures deduplicated by sample id. Truth: PEFT layer inputs for the re-admitted sample."""
from _common import *

S = [sample(1, 10)]


def check(cls):
    h = make(cls)
    # step 0: sample 1, aborted before layer 1 (the second poll); step 1: sample 1 again (back from the pool)
    ic, sk, rec = install(h, plan=lambda b, i: S if i < 2 else [], abort=lambda s, i: i == 1)
    h.set_finetune_adapter(ft_state(seed=FT_ADAPTER_SEED))
    ran0 = h.run_idle_step()
    aborted = rec.records[-1].aborted_sample_ids if rec.records else None
    sk.events.clear()
    ran1 = h.run_idle_step()
    bad = capture_problems(h, sk, S)
    done = rec.records[-1].finetune_sample_ids if rec.records else None
    return ran0 and ran1 and aborted == (1,) and not bad, (
        f"step 0 aborted {aborted}; step 1 re-admits sample 1 (completed {done}); its captures vs PEFT: {bad}")


run("p21", check, host_module("21").Host)
