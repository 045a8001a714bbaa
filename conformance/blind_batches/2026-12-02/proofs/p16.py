from common import *
RULE = ('HostHooks.set_finetune_adapter: "Called by the core ... after every optimizer step ... Fine-tuning rows of later '
        'steps must use exactly these weights" (second call, version 1)')
def check(cls):
    h = make(cls); v0 = ft_state()
    v1 = v0.with_tensors({k: (t * 4 if "lora_B" in k else t) for k, t in v0.tensors.items()})
    s = sample(1, 20)
    icp, sink, steps = install(h, policy=lambda b, k: (s,))
    h.run_idle_step()
    h.set_finetune_adapter(v1)
    sink.events.clear()
    h.run_idle_step()
    return check_captures(sink, {1: s}, v1)
run_proof("h16_set_adapter_cached_by_name", RULE, check, "blindhosts.h16_set_adapter_cached_by_name:Host")
