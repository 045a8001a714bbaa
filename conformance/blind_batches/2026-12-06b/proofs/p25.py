"""p25: a fine-tuning-only step (run_idle_step) is reported with synthetic=False: it is no calibration step."""
from _common import *  # noqa: F403


def check(cls):
    h, ic, sk, rec, ran = idle_capture(cls, [sample(1, 10)])
    got = [(r.step_id, r.finetune_sample_ids, r.synthetic) for r in rec.records]
    return ran and all(not r.synthetic for r in rec.records), (
        f"FT-only idle step ran={ran}; records (step, ft ids, synthetic): {got}")


run("p25", check, host_module("25").Host)
