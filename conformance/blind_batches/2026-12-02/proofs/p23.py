from common import *
RULE = 'HostHooks.report_step_time: "exactly one StepRecord per executed step" + should_abort: "reports them in StepRecord.aborted_sample_ids" (an aborted step)'
def check(cls):
    h = make(cls); s = sample(1, 12)
    icp, sink, steps = install(h, policy=lambda b, k: (s,) if k == 0 else (), abort=lambda st, k: True)
    h.run_idle_step()
    sid = icp.batches[0].step_id
    recs = steps.by_step(sid)
    return len(recs) == 1 and recs[0].aborted_sample_ids == (1,), f"records for aborted step {sid}: {len(recs)}"
run_proof("h23_no_record_on_abort", RULE, check, "blindhosts.h23_no_record_on_abort:Host")
