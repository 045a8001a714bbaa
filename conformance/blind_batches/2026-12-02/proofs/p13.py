from common import *
RULE = ('ActivationSink.should_abort: "Whether the host must stop a fine-tuning-only step now. Called by: the host at every '
        'decoder-layer boundary of a step that carries *only* fine-tuning rows" (a mixed step while the core signals abort)')
def check(cls):
    h = make(cls); s = sample(4, 12)
    icp, sink, steps = install(h, policy=lambda b, k: (s,) if k == 0 else (), abort=lambda st, k: True)
    h.submit(ClientRequest("a", prompt(8, 1), 2))
    drain(h)
    polls = [e for e in sink.events if e[0] == "abort?"]
    rec = steps.records[0]
    ok = not polls and rec.finetune_sample_ids == (4,)
    return ok, f"should_abort calls in a mixed step: {len(polls)}; record finetune={rec.finetune_sample_ids} aborted={rec.aborted_sample_ids}"
run_proof("h13_abort_in_mixed_step", RULE, check, "blindhosts.h13_abort_in_mixed_step:Host")
