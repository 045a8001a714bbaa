from common import *
RULE = 'ActivationSink.layer_input: "The input of decoder layer `layer` for one sample: shape [num_tokens, hidden_size]" (two samples, shorter first)'
def check(cls):
    h = make(cls); st = ft_state(); ss = (sample(1, 10), sample(2, 30))
    icp, sink, steps = install(h, policy=lambda b, k: ss if k == 0 else ())
    h.run_idle_step()
    return check_captures(sink, {s.sample_id: s for s in ss}, st)
run_proof("h21_capture_order_by_length", RULE, check, "blindhosts.h21_capture_order_by_length:Host")
