from common import *
RULE = 'HostHooks.report_step_time: "exactly one StepRecord per executed step ... with the composition that actually ran" (a mixed prefill+decode step)'
def check(cls):
    h = make(cls); icp, sink, steps = install(h)
    h.submit(ClientRequest("a", prompt(8, 1), 5)); h.submit(ClientRequest("b", prompt(9, 2), 5))
    h.step()
    h.submit(ClientRequest("c", prompt(7, 3), 3))
    drain(h)
    probs = []
    for b in icp.batches:
        for rec in steps.by_step(b.step_id):
            want = (b.prefill_lengths, b.num_decode, b.kv_tokens)
            got = (rec.prefill_lengths, rec.num_decode, rec.kv_tokens)
            if want != got:
                probs.append(f"step {b.step_id}: ran (prefills, decodes, kv) {want}, record says {got}")
    return not probs, "; ".join(probs[:3]) or "records match what ran"
run_proof("h06_record_mixed_drops_decodes", RULE, check, "blindhosts.h06_record_mixed_drops_decodes:Host")
