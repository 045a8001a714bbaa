"""p11: a record's finetune_lengths are the tokens its fine-tuning rows ran (prompt-masked sample: all 12)."""
from _common import *  # noqa: F403


def check(cls):
    h = make(cls)
    h.set_finetune_adapter(ft_state())
    base = sample(0, 12)
    s = FineTuneSample(0, base.input_ids, (False,) * 6 + (True,) * 6)  # prompt masked out, as SFT data is
    ic, sk, rec = install(h, plan=lambda b, i: [s] if i == 0 else ())
    h.generate([ClientRequest("a", prompt(8, 1), 2)])
    got = [r.finetune_lengths for r in rec.records if r.finetune_sample_ids]
    return got == [(12,)], f"finetune_lengths {got} for a 12-token sample"


run("p11", check, host_module("11").Host)
