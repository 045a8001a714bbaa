from common import *
RULE = 'ActivationSink.should_abort: "On True the host stops the forward at that boundary"'
def check(cls):
    h = make(cls); s = sample(1, 40)
    icp, sink, steps = install(h, policy=lambda b, k: (s,) if k == 0 else (), abort=lambda st, k: k == 1)
    calls = []
    orig = h._layer
    h._layer = lambda li, *a: (calls.append(li), orig(li, *a))[1]
    h.run_idle_step()
    rec = steps.records[-1]
    ok = calls == [0] and rec.aborted_sample_ids == (1,)
    return ok, f"abort returned True at the layer-1 boundary; layers executed: {calls}; aborted={rec.aborted_sample_ids}"
run_proof("h10_abort_continues_compute", RULE, check, "blindhosts.h10_abort_continues_compute:Host")
