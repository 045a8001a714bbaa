"""p15: a fine-tuning row sharing a step with client rows is never aborted (should_abort only for FT-only steps)."""
from _common import *  # noqa: F403

H = host_module("15").Host
S = sample(1, 10)


def check(cls):
    h = make(cls)
    ic, sk, rec = install(h, plan=lambda b, i: [S] if i == 0 else [], abort=lambda s, i: True)
    h.set_finetune_adapter(ft_state(seed=FT_ADAPTER_SEED))
    p = prompt(8, 51)
    out = list(h.generate([ClientRequest("r", p, 3)])[0].token_ids)
    r0 = rec.records[0]
    asked = [e[1] for e in sk.events if e[0] == "abort?"]
    bad = capture_problems(h, sk, [S])
    truth = hf_greedy(p, 3)
    ok = r0.finetune_sample_ids == (1,) and not r0.aborted_sample_ids and not asked and not bad and out == truth
    return ok, (f"mixed step {r0.step_id} (prefill {r0.prefill_lengths} + sample 1), core answers abort=True: "
                f"completed {r0.finetune_sample_ids}, aborted {r0.aborted_sample_ids}, should_abort asked in steps "
                f"{asked}; captures {bad[:2] or 'complete and exact'}; client tokens {out} (truth {truth})")


run("p15", check, H)
