from common import *
RULE = 'ActivationSink.should_abort: "On True the host ... calls end_step with all samples aborted and reports them in StepRecord.aborted_sample_ids" (3 samples)'
def check(cls):
    h = make(cls); ss = (sample(1, 10), sample(2, 12), sample(3, 14))
    icp, sink, steps = install(h, policy=lambda b, k: ss if k == 0 else (), abort=lambda st, k: True)
    h.run_idle_step()
    end = [e for e in sink.events if e[0] == "end"][-1]
    rec = steps.records[-1]
    ok = end[2] == () and set(end[3]) == {1, 2, 3} and set(rec.aborted_sample_ids) == {1, 2, 3} and not rec.finetune_sample_ids
    return ok, f"end_step completed={end[2]} aborted={end[3]}; record finetune={rec.finetune_sample_ids} aborted={rec.aborted_sample_ids}"
run_proof("h12_abort_partial_ids", RULE, check, "blindhosts.h12_abort_partial_ids:Host")
