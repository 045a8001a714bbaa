"""p04: every sample on_schedule returned is run or refused in that step's record (hooks.py, intercept_schedule)."""
import _common as c


def check(cls):
    samples = [c.sample(i, 10) for i in (1, 2, 3)]
    h = c.make(cls)
    ic, sk, rec = c.install(h, plan=lambda b, i: samples if i == 0 else [])
    h.set_finetune_adapter(c.ft_state(seed=c.FT_ADAPTER_SEED))
    for k in range(31):
        h.submit(c.req(f"r{k}", 4, 100 + k, 2))
    h.step()
    r0 = rec.records[0]
    returned = {1, 2, 3}
    accounted = set(r0.finetune_sample_ids) | set(r0.aborted_sample_ids)
    c.drain(h)
    later = [r.finetune_sample_ids for r in rec.records[1:] if r.finetune_sample_ids]
    ok = returned == accounted and not later
    return ok, (f"31 client prefills + samples [1, 2, 3] returned for step {r0.step_id}: record ran "
                f"{r0.finetune_sample_ids}, refused {r0.aborted_sample_ids}; unaccounted {sorted(returned - accounted)}")


c.run("p04", check, c.host_module("04").Host)
