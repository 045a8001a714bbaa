"""p35: one record per executed step, in step order, delivered once the step's outputs are processed
(hooks.py, HostHooks.report_step_time) -- here an aborted fine-tuning-only step followed by a client step."""
import _common as c


def check(cls):
    s1 = c.sample(1, 10)
    h = c.make(cls)
    ic, sk, rec = c.install(h, plan=lambda b, i: [s1] if i == 0 else [], abort=lambda s, i: True)
    h.set_finetune_adapter(c.ft_state(seed=c.FT_ADAPTER_SEED))
    ran = h.run_idle_step()
    after_idle = [r.step_id for r in rec.records]
    h.submit(c.req("r", 6, 25, 2))
    c.drain(h)
    order = [r.step_id for r in rec.records]
    offered = [b.step_id for b in ic.batches]
    ok = ran and after_idle == [offered[0]] and order == offered
    return ok, (f"aborted FT-only step {offered[0]}: records delivered when run_idle_step returned {after_idle}; "
                f"all records in order {order}, steps run {offered}")


c.run("p35", check, c.host_module("35").Host)
