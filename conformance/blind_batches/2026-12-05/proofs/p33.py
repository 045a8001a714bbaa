"""p33: begin_step is called once per step carrying fine-tuning rows, before layer 0, mixed steps included
(hooks.py, ActivationSink.begin_step)."""
import _common as c


def check(cls):
    s1 = c.sample(1, 12)
    h = c.make(cls)
    ic, sk, rec = c.install(h, plan=lambda b, i: [s1] if i == 0 else [])
    h.set_finetune_adapter(c.ft_state(seed=c.FT_ADAPTER_SEED))
    h.submit(c.req("r", 8, 24, 2))
    c.drain(h)
    step = rec.records[0].step_id
    ev = [e[:4] if e[0] == "layer" else e for e in sk.events if e[1] == step]
    kinds = [e[0] for e in ev]
    ok = (rec.records[0].finetune_sample_ids == (1,) and kinds.count("begin") == 1 and kinds[0] == "begin"
          and ev[0][2] == (1,))
    bad = c.capture_problems(h, sk, [s1])
    return ok and not bad, f"mixed step {step} (prompt 8 + sample 1): sink calls {kinds}; captures {bad or 'match PEFT'}"


c.run("p33", check, c.host_module("33").Host)
