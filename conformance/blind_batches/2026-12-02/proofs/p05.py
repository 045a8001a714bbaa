from common import *
RULE = ('HostHooks.intercept_schedule: "calls interceptor.on_schedule(batch) once per step before dispatch with the batch '
        'it will run" (20 concurrent requests)')
def check(cls):
    h = make(cls); icp, sink, steps = install(h)
    for i in range(20): h.submit(ClientRequest(f"r{i}", prompt(5, i), 2))
    drain(h)
    probs = []
    for b in icp.batches:
        for rec in steps.by_step(b.step_id):
            ran = len(rec.prefill_lengths) + rec.num_decode
            if ran != len(b.scheduled):
                probs.append(f"step {b.step_id}: proposed {len(b.scheduled)} requests, ran {ran}")
    return not probs, "; ".join(probs[:3]) or "every proposed batch is what ran"
run_proof("h05_proposal_capped", RULE, check, "blindhosts.h05_proposal_capped:Host")
