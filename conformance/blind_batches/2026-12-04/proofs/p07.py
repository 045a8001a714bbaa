"""p07: capabilities().mixed_batches tells the truth: if declared, a decode step takes fine-tuning rows."""
from _common import *  # noqa: F403

H = host_module("07").Host
S = sample(1, 8)


def check(cls):
    h = make(cls, mixed_batches=False)
    declared = h.capabilities().mixed_batches
    # the core admits fine-tuning into a decode step only when the host declares mixed batches
    done = []

    def plan(b, i):  # as the core would: a decode step is offered a sample only on a mixed-batch host
        if declared and not done and b.scheduled and not b.has_prefill:
            done.append(b.step_id)
            return [S]
        return []

    ic, sk, rec = install(h, plan=plan)
    h.set_finetune_adapter(ft_state(seed=FT_ADAPTER_SEED))
    try:
        h.submit(ClientRequest("a", prompt(7, 3), 4))
        h.step()  # a's prefill
        h.submit(ClientRequest("b", prompt(5, 4), 3))  # b arrives while a decodes
        drain(h)
    except Exception as e:  # noqa: BLE001
        return False, f"declared mixed_batches={declared} (started with mixed_batches=False); fine-tuning row in " \
                      f"decode step {done}: {type(e).__name__}: {str(e)[:110]}"
    mixed = [r.step_id for r in rec.records if r.prefill_lengths and r.num_decode]
    took = [r.step_id for r in rec.records if S.sample_id in r.finetune_sample_ids]
    ok = (declared and bool(took)) or (not declared and not mixed)
    return ok, f"declared mixed_batches={declared}; steps mixing prefill+decode {mixed}; sample ran in steps {took}"


run("p07", check, H)
