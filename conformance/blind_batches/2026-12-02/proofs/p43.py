from common import *
RULE = 'ActivationSink.layer_input: "The input of decoder layer `layer` for one sample" (a sample sharing a step with a client prefill)'
def check(cls):
    h = make(cls); st = ft_state(); s = sample(1, 16)
    icp, sink, steps = install(h, policy=lambda b, k: (s,) if k == 0 else ())
    h.generate([ClientRequest("a", prompt(8, 1), 2)])
    return check_captures(sink, {1: s}, st)
run_proof("h43_ft_attention_crosses_row", RULE, check, "blindhosts.h43_ft_attention_crosses_row:Host")
