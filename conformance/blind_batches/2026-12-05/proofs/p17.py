"""p17: exactly one StepRecord per executed step; none for an iteration that ran nothing
(hooks.py, report_step_time; driver.py, run_idle_step)."""
import _common as c


def check(cls):
    h = c.make(cls)
    ic, sk, rec = c.install(h)  # the interceptor adds nothing
    h.set_finetune_adapter(c.ft_state(seed=c.FT_ADAPTER_SEED))
    ran = h.run_idle_step()
    outs = h.step()  # idle host: nothing to run
    ok = ran is False and outs == [] and rec.records == []
    return ok, (f"run_idle_step() -> {ran} (interceptor added nothing), step() on an idle host -> {outs}; "
                f"records delivered: {[(r.step_id, r.prefill_lengths, r.num_decode, r.finetune_sample_ids) for r in rec.records]}")


c.run("p17", check, c.host_module("17").Host)
