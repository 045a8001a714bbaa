from common import *
RULE = ('ActivationSink.layer_input: "The input of decoder layer `layer`" + set_finetune_adapter: "Fine-tuning rows of '
        'later steps must use exactly these weights" (r=8 adapter, max_lora_rank=16)')
def check(cls):
    h = make(cls); st = ft_state(); s = sample(1, 20)
    icp, sink, steps = install(h, policy=lambda b, k: (s,) if k == 0 else ())
    h.run_idle_step()
    return check_captures(sink, {1: s}, st)
run_proof("h19_lora_scaling_padded_rank", RULE, check, "blindhosts.h19_lora_scaling_padded_rank:Host")
