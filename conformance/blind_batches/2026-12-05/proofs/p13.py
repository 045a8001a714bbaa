"""p13: an aborted fine-tuning-only step calls end_step with all samples aborted (hooks.py, should_abort)."""
import _common as c


def check(cls):
    samples = [c.sample(1, 10), c.sample(2, 8)]
    h = c.make(cls)
    ic, sk, rec = c.install(h, plan=lambda b, i: samples if i == 0 else [], abort=lambda s, i: True)
    h.set_finetune_adapter(c.ft_state(seed=c.FT_ADAPTER_SEED))
    ran = h.run_idle_step()
    ends = [e for e in sk.events if e[0] == "end"]
    r = rec.records[0]
    ok = ran and ends == [("end", r.step_id, (), (1, 2))] and r.aborted_sample_ids == (1, 2)
    return ok, f"aborted at layer 0: end_step calls {ends}; record aborted {r.aborted_sample_ids}"


c.run("p13", check, c.host_module("13").Host)
