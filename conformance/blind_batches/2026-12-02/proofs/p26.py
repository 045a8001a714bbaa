from common import *
RULE = ('ScheduleInterceptor.on_schedule: "exactly once per step ... (also for steps with no inference rows, so the core '
        'can issue a fine-tuning-only step)"')
def check(cls):
    h = make(cls); s = sample(1, 12)
    icp, sink, steps = install(h, policy=lambda b, k: (s,) if k == 0 else ())
    ran = h.run_idle_step()
    return bool(icp.batches) and ran and steps.records and steps.records[-1].finetune_sample_ids == (1,), \
        f"idle engine: on_schedule calls {len(icp.batches)}, step executed {ran}"
run_proof("h26_idle_step_not_offered", RULE, check, "blindhosts.h26_idle_step_not_offered:Host")
