"""p12: should_abort is asked at every layer boundary of a fine-tuning-only step and honoured there
(hooks.py, ActivationSink.should_abort)."""
import _common as c


def check(cls):
    s1 = c.sample(1, 10)
    h = c.make(cls)
    # the core answers True from the second boundary on (a request arrived while layer 0 ran)
    ic, sk, rec = c.install(h, plan=lambda b, i: [s1] if i == 0 else [], abort=lambda s, i: i >= 1)
    h.set_finetune_adapter(c.ft_state(seed=c.FT_ADAPTER_SEED))
    ran = h.run_idle_step()
    asked = [e for e in sk.events if e[0] == "abort?"]
    r = rec.records[0]
    ok = ran and len(asked) == 2 and r.aborted_sample_ids == (1,) and r.finetune_sample_ids == ()
    return ok, (f"2-layer FT-only step, abort answer True from boundary 1: asked {len(asked)} time(s) "
                f"{[a[2] for a in asked]}; record ran {r.finetune_sample_ids}, aborted {r.aborted_sample_ids}")


c.run("p12", check, c.host_module("12").Host)
