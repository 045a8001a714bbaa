"""p20: in the record of a step with two fine-tuning samples, finetune_lengths[i] is the length of
finetune_sample_ids[i] (truth: the samples injected)."""
from _common import host_module, idle_capture, run, sample

SAMPLES = [sample(1, 5), sample(2, 12)]
TRUTH = {s.sample_id: s.num_tokens for s in SAMPLES}


def check(cls):
    h, ic, sk, rec, ran = idle_capture(cls, SAMPLES)
    r = [x for x in rec.records if x.finetune_sample_ids][0]
    got = dict(zip(r.finetune_sample_ids, r.finetune_lengths))
    return got == TRUTH, f"ids {r.finetune_sample_ids} lengths {r.finetune_lengths}; truth {TRUTH}"


run("p20", check, host_module("20").Host)
