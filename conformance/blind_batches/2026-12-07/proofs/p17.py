"""p17: an aborted fine-tuning-only step's record lists its samples as aborted only."""
from _common import *  # noqa: F403

Host = host_module("17").Host
S = sample(1, 10)


def check(cls):
    h = make(cls)
    ic, sk, rec = install(h, plan=lambda b, i: [S] if i == 0 else [], abort=lambda s, i: i == 1)
    h.set_finetune_adapter(ft_state(seed=FT_ADAPTER_SEED))
    ran = h.run_idle_step()
    r = rec.records[0]
    ok = r.aborted_sample_ids == (1,) and r.finetune_sample_ids == () and r.finetune_lengths == ()
    return ok, (f"FT-only step aborted before layer 1 (ran={ran}): record completed {r.finetune_sample_ids} lengths "
                f"{r.finetune_lengths} aborted {r.aborted_sample_ids}")


run("p17", check, Host)
