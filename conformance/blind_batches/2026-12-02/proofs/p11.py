from common import *
RULE = ('ActivationSink.should_abort: "Called by: the host at every decoder-layer boundary of a step that carries only '
        'fine-tuning rows" (abort requested after layer 0 started)')
def check(cls):
    h = make(cls); s = sample(1, 40)
    icp, sink, steps = install(h, policy=lambda b, k: (s,) if k == 0 else (), abort=lambda st, k: k >= 1)
    h.run_idle_step()
    polls = [e for e in sink.events if e[0] == "abort?"]
    rec = steps.records[-1]
    return (len(polls) == 2 and rec.aborted_sample_ids == (1,)), f"should_abort polled {len(polls)}x over {LAYERS} layers; aborted={rec.aborted_sample_ids}"
run_proof("h11_abort_checked_once", RULE, check, "blindhosts.h11_abort_checked_once:Host")
