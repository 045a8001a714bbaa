from common import *
RULE = ('HostHooks.set_finetune_adapter: "Fine-tuning rows of later steps must use exactly these weights" '
        '(the core keeps updating its tensors in place before the next call)')
def check(cls):
    v0 = ft_state(); snapshot = LoraAdapterState(v0.name, v0.version, v0.config, {k: t.clone() for k, t in v0.tensors.items()})
    h = make(cls, state=v0); s = sample(1, 20)
    icp, sink, steps = install(h, policy=lambda b, k: (s,))
    for k, t in v0.tensors.items():  # optimizer working on the core's own tensors
        if "lora_B" in k: t.mul_(-3.0)
    h.run_idle_step()
    return check_captures(sink, {1: s}, snapshot)
run_proof("h17_set_adapter_aliases", RULE, check, "blindhosts.h17_set_adapter_aliases:Host")
