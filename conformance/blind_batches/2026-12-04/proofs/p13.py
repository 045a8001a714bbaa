"""p13: samples returned by on_schedule run in that step or are refused in its record; never carried on."""
from _common import *  # noqa: F403

H = host_module("13").Host
SAMPLES = [sample(1, 16), sample(2, 16)]


def check(cls):
    h = make(cls, max_batch_tokens=64)
    ic, sk, rec = install(h, plan=lambda b, i: SAMPLES if i == 0 else [])
    h.set_finetune_adapter(ft_state(seed=FT_ADAPTER_SEED))
    h.generate([ClientRequest("long", prompt(40, 9), 3)])
    step0 = ic.batches[0].step_id
    where = {s.sample_id: [(r.step_id, "ran" if s.sample_id in r.finetune_sample_ids else "refused")
                           for r in rec.records
                           if s.sample_id in r.finetune_sample_ids + r.aborted_sample_ids] for s in SAMPLES}
    ok = all(v == [(step0, "ran")] or v == [(step0, "refused")] for v in where.values())
    return ok, f"both samples returned for step {step0} (40-token prompt, max_batch_tokens=64); in records: {where}"


run("p13", check, H)
