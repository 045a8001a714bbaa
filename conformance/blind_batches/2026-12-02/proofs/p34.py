from common import *
RULE = ('HostHooks.set_finetune_adapter: "Load or replace the weights of the reserved fine-tuning adapter ... Fine-tuning '
        'rows of later steps must use exactly these weights" (the core\'s state must come back unchanged; re-sending it)')
def check(cls):
    st = ft_state(); snap = {k: t.clone() for k, t in st.tensors.items()}
    h = make(cls, state=st)
    changed = [k for k in st.tensors if not torch.equal(st.tensors[k], snap[k])]
    h.set_finetune_adapter(st)  # e.g. re-sent after an optimizer step that did not change this tensor
    s = sample(1, 20)
    icp, sink, steps = install(h, policy=lambda b, k: (s,) if k == 0 else ())
    h.run_idle_step()
    orig = LoraAdapterState(st.name, st.version, st.config, snap)
    ok, detail = check_captures(sink, {1: s}, orig)
    return ok and not changed, f"caller's tensors modified: {len(changed)}; {detail}"
run_proof("h34_set_adapter_folds_scaling_in_place", RULE, check, "blindhosts.h34_set_adapter_folds_scaling_in_place:Host")
