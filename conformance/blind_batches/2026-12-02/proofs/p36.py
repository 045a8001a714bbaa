from common import *
RULE = 'ActivationSink.layer_input: "The input of decoder layer `layer` for one sample" (the second sample of a step)'
def check(cls):
    h = make(cls); st = ft_state(); ss = (sample(1, 16), sample(2, 16))
    icp, sink, steps = install(h, policy=lambda b, k: ss if k == 0 else ())
    h.run_idle_step()
    return check_captures(sink, {s.sample_id: s for s in ss}, st)
run_proof("h36_ft_positions_global", RULE, check, "blindhosts.h36_ft_positions_global:Host")
