from common import *
RULE = ('HostHooks.set_finetune_adapter: "Fine-tuning rows of later steps must use exactly these weights" '
        '(a step with a client adapter, a published adapter and fine-tuning rows)')
def check(cls):
    h = make(cls); st = ft_state(); s = sample(1, 16)
    icp, sink, steps = install(h, policy=lambda b, k: (s,) if (b.num_decode == 2 and not b.has_prefill and not sink.layers()) else ())
    pub = h.publish_adapter(ft_state(CLIENT, name="job", version=1).with_tensors(
        {k: t * 2 for k, t in ft_state(CLIENT).tensors.items()}))
    h.submit(ClientRequest("c", prompt(8, 1), 4, adapter="client"))
    h.submit(ClientRequest("p", prompt(8, 2), 4, adapter=pub))
    drain(h)
    if not sink.layers(): return False, "never injected"
    return check_captures(sink, {1: s}, st)
run_proof("h35_ft_slot_overflow", RULE, check, "blindhosts.h35_ft_slot_overflow:Host")
