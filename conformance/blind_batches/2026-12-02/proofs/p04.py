from common import *
RULE = ('ScheduledRequest: "context_tokens is the KV-cache length the request attends over *before* this step"; '
        'StepRecord.kv_tokens of the same step reports what ran')
def check(cls):
    h = make(cls); icp, sink, steps = install(h)
    lens = {"a": 9, "b": 13}
    for rid, n in lens.items(): h.submit(ClientRequest(rid, prompt(n, n), 4))
    drain(h)
    probs = []
    for b in icp.batches:
        for r in b.scheduled:
            if r.is_decode:
                kv = lens[r.request_id] + r.output_tokens - 1  # prompt + all generated tokens but the one fed now
                if r.context_tokens != kv:
                    probs.append(f"step {b.step_id} {r.request_id}: context_tokens {r.context_tokens}, KV holds {kv}")
        rec = steps.by_step(b.step_id)
        if rec and rec[0].kv_tokens != b.kv_tokens:
            probs.append(f"step {b.step_id}: batch.kv_tokens {b.kv_tokens} != record.kv_tokens {rec[0].kv_tokens}")
    return not probs, "; ".join(probs[:3]) or "context_tokens = KV length before the step"
run_proof("h04_context_tokens_off_by_one", RULE, check, "blindhosts.h04_context_tokens_off_by_one:Host")
