from common import *
RULE = 'HostHooks.report_step_time: "exactly one StepRecord per executed step, in step order"'
def check(cls):
    h = make(cls); s = sample(1, 12)
    icp, sink, steps = install(h, policy=lambda b, k: (s,) if k == 0 else ())
    h.run_idle_step()
    h.generate([ClientRequest("a", prompt(6, 1), 3)])
    ids = [r.step_id for r in steps.records]
    executed = [b.step_id for b in icp.batches]
    return ids == sorted(ids) and ids == executed, f"record step ids in delivery order {ids}; steps executed {executed}"
run_proof("h24_record_order_swapped", RULE, check, "blindhosts.h24_record_order_swapped:Host")
