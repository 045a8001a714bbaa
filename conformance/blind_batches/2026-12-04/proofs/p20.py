"""p20: a long fine-tuning sample runs whole (record length, full captures) or is refused in the record."""
from _common import *  # noqa: F403

H = host_module("20").Host
SAMPLES = [sample(1, 200), sample(2, 40)]


def check(cls):
    h, ic, sk, rec, ran = idle_capture(cls, SAMPLES)
    r = rec.records[0]
    lengths = dict(zip(r.finetune_sample_ids, r.finetune_lengths))
    refused = set(r.aborted_sample_ids)
    ran_ok = [s for s in SAMPLES if s.sample_id not in refused]
    bad = [f"sample {s.sample_id}: record length {lengths.get(s.sample_id)} != {s.num_tokens}"
           for s in ran_ok if lengths.get(s.sample_id) != s.num_tokens]
    bad += capture_problems(h, sk, ran_ok)
    return not bad, f"samples of 200 and 40 tokens: lengths {lengths}, refused {sorted(refused)}; {bad[:3] or 'ok'}"


run("p20", check, H)
