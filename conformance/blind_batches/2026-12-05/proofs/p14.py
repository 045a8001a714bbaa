"""p14: steps carrying fine-tuning rows run eagerly so capture hooks fire (hooks.py, HostHooks.capture_activation).
Reference: the reference host and the batch's correct graph host (_graphs.GraphHost)."""
import _common as c
from blindhosts._graphs import GraphHost


def check(cls):
    s1 = c.sample(1, 10)
    h = c.make(cls)
    state = {"done": False}

    def plan(b, i):
        if not state["done"] and b.scheduled and not b.has_prefill:
            state["done"] = True
            return [s1]
        return []
    ic, sk, rec = c.install(h, plan=plan)
    h.set_finetune_adapter(c.ft_state(seed=c.FT_ADAPTER_SEED))
    h.submit(c.req("r", 6, 10, 4))
    outs = c.drain(h)
    ft = [r for r in rec.records if r.finetune_sample_ids]
    bad = c.capture_problems(h, sk, [s1])
    truth = c.hf_greedy(c.prompt(6, 10), 4)
    ok = len(ft) == 1 and not bad and list(outs[0].token_ids) == truth
    return ok, (f"sample 1 in decode step {[r.step_id for r in ft]} (record mode {[r.mode.value for r in ft]}); "
                f"captures: {bad or 'all match PEFT'}")


ok1, m1 = check(c.ReferenceHost)
ok2, m2 = check(GraphHost)
okb, mb = check(c.host_module("14").Host)
c.verdict("p14", ok1 and ok2, f"reference: {m1} | correct graph host: {m2}", okb, mb)
