from common import *
RULE = ('HostHooks.set_finetune_adapter: "Fine-tuning rows of later steps must use exactly these weights" '
        '(an adapter targeting MLP projections)')
def check(cls):
    st = ft_state(FT_MLP); h = make(cls, state=st); s = sample(1, 20)
    icp, sink, steps = install(h, policy=lambda b, k: (s,) if k == 0 else ())
    h.run_idle_step()
    return check_captures(sink, {1: s}, st)
run_proof("h20_lora_attention_only", RULE, check, "blindhosts.h20_lora_attention_only:Host")
