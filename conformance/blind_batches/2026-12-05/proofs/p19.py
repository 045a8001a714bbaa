"""p19: a step_id is never reused; ids increase (types.py, StepRecord)."""
import _common as c


def check(cls):
    s1 = c.sample(1, 10)
    h = c.make(cls)
    state = {"idle": False}
    ic, sk, rec = c.install(h, plan=lambda b, i: [s1] if state["idle"] and not b.scheduled else [])
    h.set_finetune_adapter(c.ft_state(seed=c.FT_ADAPTER_SEED))
    h.submit(c.req("r", 5, 14, 3))
    c.drain(h)
    state["idle"] = True
    ran = h.run_idle_step()
    ids = [r.step_id for r in rec.records]
    offered = [b.step_id for b in ic.batches]
    ok = ran and len(set(ids)) == len(ids) and ids == sorted(ids) and len(set(offered)) == len(offered)
    return ok, f"served 3 steps then one idle step (ran={ran}): record step ids {ids}, offered {offered}"


c.run("p19", check, c.host_module("19").Host)
