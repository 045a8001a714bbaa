"""p03: fine-tuning rows never reach a client (hooks.py, HostHooks.intercept_schedule)."""
import _common as c


def check(cls):
    s1 = c.sample(1, 12)
    h = c.make(cls)
    ic, sk, rec = c.install(h, plan=lambda b, i: [s1] if i == 0 else [])
    h.set_finetune_adapter(c.ft_state(seed=c.FT_ADAPTER_SEED))
    h.submit(c.req("r", 8, 3, 3))
    outs = c.drain(h)
    got = [o.request_id for o in outs]
    ran = [r.finetune_sample_ids for r in rec.records if r.finetune_sample_ids]
    truth = c.hf_greedy(c.prompt(8, 3), 3)
    tokens = {o.request_id: list(o.token_ids) for o in outs}
    ok = got == ["r"] and ran == [(1,)] and tokens.get("r") == truth
    return ok, f"submitted ['r'], step() returned {got}; sample 1 ran in steps {ran}; r tokens {tokens.get('r')} (truth {truth})"


c.run("p03", check, c.host_module("03").Host)
