from common import *
RULE = 'ActivationSink.layer_input: "shape [num_tokens, hidden_size]" (a 300-token sample)'
def check(cls):
    h = make(cls); st = ft_state(); s = sample(1, 300)
    icp, sink, steps = install(h, policy=lambda b, k: (s,) if k == 0 else ())
    assert h.run_idle_step()
    return check_captures(sink, {1: s}, st)
run_proof("h02_capture_truncated_long", RULE, check, "blindhosts.h02_capture_truncated_long:Host")
